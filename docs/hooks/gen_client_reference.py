"""reference/python-client.md: `perdure.Client`'s reference, generated from the class when the
site is built (mkdocs-gen-files runs this): every public method with its signature as written
in the source and its docstring, the steering verbs apart, the types the methods return with
their fields, and the errors. A method added to the client appears at the next build; the
guide page (guide/python-client.md) says how to use it.

Not mkdocstrings: its cross-reference plugin (mkdocs-autorefs, which it needs) reads the CLI
reference's usage lines (`[OPTIONS] [GOAL]`) as links and fails the strict build, and its
reader cannot follow setup.py's mapping of folders into the package. Writes one page; reads
nothing but the classes.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator

import mkdocs_gen_files
from pydantic import BaseModel

from perdure.starters.client import client_errors
from perdure.starters.client.goal_events import StreamItem
from perdure.starters.client.goal_reads import ClosedReport
from perdure.starters.client.goal_starts import StartAnswer
from perdure.starters.client.message_delivery import Delivery, InboxResult
from perdure.starters.client.perdure_client import Client
from perdure.starters.client.steering_verbs import SteeringVerbs
from perdure.workflows.goal.contracts.goal_contracts import GoalResult, QuestionView

RETURNED = [StartAnswer, Delivery, QuestionView, StreamItem, ClosedReport, GoalResult, InboxResult]
ERRORS = [
    client_errors.PerdureError,
    client_errors.InvalidRequest,
    client_errors.BadPlanFile,
    client_errors.GoalNotFound,
    client_errors.StartRefused,
    client_errors.NotOffered,
    client_errors.MessageRejected,
    client_errors.GoalEnded,
    client_errors.StillRunning,
    client_errors.EndedWithoutResult,
    client_errors.ResultUnreadable,
    client_errors.NoWorkerAnswered,
]


class _AsWritten(str):
    """An annotation as the source writes it (the modules use postponed annotations), shown
    without the quotes `inspect` puts around a string."""

    def __repr__(self) -> str:
        return str(self)


def public_methods(cls: type) -> Iterator[tuple[str, object]]:
    """The class's own public methods, in the order the source defines them."""
    for name in vars(cls):
        if not name.startswith("_") and callable(getattr(cls, name)):
            yield name, getattr(cls, name)


def signature_text(name: str, method: object) -> str:
    signature = inspect.signature(method)
    parameters = [p for p in signature.parameters.values() if p.name != "self"]
    shown = signature.replace(
        parameters=[
            p.replace(annotation=_AsWritten(p.annotation)) if p.annotation is not p.empty else p for p in parameters
        ],
        return_annotation=_AsWritten(signature.return_annotation),
    )
    asynchronous = inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method)
    line = f"{'async ' if asynchronous else ''}def {name}{shown}"
    if len(line) <= 100:
        return line
    # One parameter a line, as a formatter would: `str(signature)` is one long line.
    head = f"{'async ' if asynchronous else ''}def {name}("
    returns = f" -> {shown.return_annotation}" if shown.return_annotation is not shown.empty else ""
    names = [str(p) for p in shown.parameters.values()]
    for index, p in enumerate(shown.parameters.values()):
        if p.kind is p.KEYWORD_ONLY and (index == 0 or names[index - 1] != "*"):
            names.insert(index, "*")
            break
    return "\n".join([head, *(f"    {text}," for text in names), f"){returns}"])


def method_section(name: str, method: object) -> list[str]:
    doc = inspect.getdoc(method) or ""
    return [f"### `{name}`", "", "```python", signature_text(name, method), "```", "", doc, ""]


def own_doc(cls: type) -> str:
    """The class's own docstring (`inspect.getdoc` would give a model without one BaseModel's)."""
    doc = vars(cls).get("__doc__")
    return inspect.cleandoc(doc) if doc else ""


def fields_of(cls: type) -> list[str]:
    if issubclass(cls, BaseModel):
        rows = [
            (name, cls.__annotations__.get(name, ""), field.description or "")
            for name, field in cls.model_fields.items()
        ]
    else:
        rows = [(f.name, f.type, "") for f in dataclasses.fields(cls)]
    return [f"- `{name}: {kind}`" + (f": {text}" if text else "") for name, kind, text in rows]


def page() -> str:
    lines = [
        "# Python client reference",
        "",
        "`perdure.Client`, generated from the class when the site is built. How to use it, with a",
        "complete program: [the Python client](../guide/python-client.md).",
        "",
        "## `perdure.Client`",
        "",
        inspect.getdoc(Client) or "",
        "",
        "`client.temporal` is the temporalio Client it works through.",
        "",
    ]
    for name, method in public_methods(Client):
        lines += method_section(name, method)
    lines += ["## Steering verbs", "", inspect.getdoc(SteeringVerbs) or "", ""]
    for name, method in public_methods(SteeringVerbs):
        if name not in vars(Client):  # `send` is the Client's, above
            lines += method_section(name, method)
    lines += ["## What the methods return", ""]
    for cls in RETURNED:
        lines += [f"### `{cls.__name__}`", "", own_doc(cls), "", *fields_of(cls), ""]
    lines += [
        "## Errors",
        "",
        "Each is exported as `perdure.<Name>`; each keeps its built-in base too.",
        "",
    ]
    for error in ERRORS:
        bases = ", ".join(base.__name__ for base in error.__bases__)
        lines += [f"### `{error.__name__}` ({bases})", "", own_doc(error), ""]
    return "\n".join(lines)


if __name__ == "<run_path>":  # how mkdocs-gen-files runs it; a test imports it to read page()
    with mkdocs_gen_files.open("reference/python-client.md", "w") as f:
        f.write(page())
