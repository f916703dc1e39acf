"""Reference pages generated from the code when the site is built (mkdocs-gen-files runs this).

It also puts this venv's `typer` on PATH for mkdocs-typer2, which renders reference/cli.md.

reference/plan-schema.md: the plan file's schema, from the pydantic models the goal validates a
plan with (`Plan`, each step type of `STEP_TYPES`, `VerifySpec`, `QuestionDeadline`) and the goal settings a plan file
may carry beside its steps (`SPEC_FIELDS_IN_PLAN`, described by `GoalSpec`). A field added to a
model appears here at the next build; a model that moves breaks the build, which `make docs` runs
strictly. Writes pages only; reads nothing but the models.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import mkdocs_gen_files
from pydantic import BaseModel

from perdure.starters.client.goal_specs import SPEC_FIELDS_IN_PLAN
from perdure.workflows.goal.contracts.deadline_contracts import QuestionDeadline
from perdure.workflows.goal.contracts.goal_contracts import GoalSpec
from perdure.workflows.goal.contracts.plan import MAX_PLANNED_STEPS, MAX_STEPS, STEP_TYPES, Plan, VerifySpec

# What a plan file's other top-level keys mean where GoalSpec's own field says nothing.
TOP_LEVEL = {
    "goal": "The goal's text, shown in every prompt and in the goal lists; needed unless `perdure start` "
    "is given the text.",
    "constraints": "Rules the goal keeps, re-sent verbatim in every prompt (a list of strings); "
    "`perdure start -c` replaces them.",
}
CONSTRAINTS = {
    "minLength": "length ≥ {}",
    "maxLength": "length ≤ {}",
    "minItems": "≥ {} items",
    "maxItems": "≤ {} items",
    "minimum": "≥ {}",
    "exclusiveMinimum": "> {}",
    "maximum": "≤ {}",
    "exclusiveMaximum": "< {}",
    "pattern": "matches `{}`",
}


def type_of(prop: dict[str, Any]) -> str:
    """A JSON schema property's type, as a reader would write it."""
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return " | ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in prop:
        kinds = [type_of(p) for p in prop["anyOf"] if p.get("type") != "null"]
        return " | ".join(kinds) + (" or null" if any(p.get("type") == "null" for p in prop["anyOf"]) else "")
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {type_of(prop.get('items', {}))}"
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        return f"map of {type_of(prop['additionalProperties'])}"
    return kind


def limits(prop: dict[str, Any]) -> str:
    found = [text.format(prop[key]) for key, text in CONSTRAINTS.items() if key in prop]
    for option in prop.get("anyOf", []):
        found += [text.format(option[key]) for key, text in CONSTRAINTS.items() if key in option]
    return "; ".join(found)


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def default_of(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.is_required():
        return "required"
    return f"`{json.dumps(field.get_default(call_default_factory=True), default=str)}`"


def fields_table(model: type[BaseModel]) -> list[str]:
    schema = model.model_json_schema()
    if "$ref" in schema:  # a recursive model (a subgoal's plan holds steps): its own entry in $defs
        schema = schema["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for name, prop in schema["properties"].items():
        meaning = prop.get("description", "")
        extra = limits(prop)
        if extra:
            meaning = f"{meaning} ({extra})" if meaning else extra
        rows.append(f"| `{name}` | {cell(type_of(prop))} | {default_of(model, name)} | {cell(meaning)} |")
    return rows


def top_level_table() -> list[str]:
    rows = [
        "| key | type | default | meaning |",
        "|---|---|---|---|",
        f"| `steps` | list of steps | required | The plan: 1 to {MAX_STEPS:,} steps (a model's plan at most "
        f"{MAX_PLANNED_STEPS}); names unique, `needs` naming earlier or later steps, no cycle. |",
    ]
    # Plan is recursive (a subgoal's plan): its own fields are its entry in $defs.
    deadline = Plan.model_json_schema()["$defs"]["Plan"]["properties"]["question_deadline"]
    rows.append(
        f"| `question_deadline` | {cell(type_of(deadline))} | `null` | {cell(deadline.get('description', ''))} "
        "(below; a step's own wins, then this, then the goal's) |"
    )
    spec = GoalSpec.model_json_schema()["properties"]
    for key in ("goal", "constraints", "premises", *SPEC_FIELDS_IN_PLAN):
        prop = spec[key]
        default = "none" if key == "goal" else default_of(GoalSpec, key)
        meaning = prop.get("description") or TOP_LEVEL.get(key, "")
        rows.append(f"| `{key}` | {cell(type_of(prop))} | {default} | {cell(meaning)} |")
    return rows


def page() -> str:
    out = [
        "# Plan file schema",
        "",
        "Generated from the models a goal validates its plan with "
        "(`perdure.workflows.goal.contracts.plan`) each time the site is built. "
        "A plan file is YAML or JSON; [Plans and goals](../guide/plans.md) shows examples.",
        "",
        "## Top level",
        "",
        "Besides `steps`, a plan file may carry the goal's text, its constraints and premises, and these "
        "goal settings (the rest of a goal's settings come from `perdure start`).",
        "",
        *top_level_table(),
        "",
        "## Steps",
        "",
        "Every step has a `kind`; the fields every kind shares (`name`, `needs`, `premises`, `wrap_up`, "
        "`verify`, `writes`, `defer`, `question_deadline`) are listed under each.",
    ]
    for step_type in STEP_TYPES:
        kind = step_type.model_fields["kind"].default
        out += ["", f"### `{kind}`", ""]
        if step_type.__doc__ and not step_type.__doc__.startswith(step_type.__name__ + "("):
            out += [" ".join(step_type.__doc__.split()), ""]
        out += fields_table(step_type)
    out += [
        "",
        "## `verify`",
        "",
        " ".join((VerifySpec.__doc__ or "").split()),
        "",
        *fields_table(VerifySpec),
        "",
        "## `question_deadline`",
        "",
        " ".join((QuestionDeadline.__doc__ or "").split()),
        "",
        *fields_table(QuestionDeadline),
        "",
        "## JSON schema",
        "",
        '??? note "The plan\'s JSON schema (`Plan.model_json_schema()`)"',
        "",
        "    ```json",
        *("    " + line for line in json.dumps(Plan.model_json_schema(), indent=2).splitlines()),
        "    ```",
        "",
    ]
    return "\n".join(out)


with mkdocs_gen_files.open("reference/plan-schema.md", "w") as f:
    f.write(page())

# The CLI reference (reference/cli.md) is rendered later by mkdocs-typer2, which runs the `typer`
# command; it is installed next to this Python, which need not be on PATH (`.venv/bin/mkdocs build`).
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
