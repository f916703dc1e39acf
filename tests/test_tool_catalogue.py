"""The tool catalogue (perdure.activities.tools.catalogue): each built-in tool declared once,
in one module, complete and consistent; a tool added in one module reaches every side (the
goal's plan check, the write it prepares, the tool activity, the compensation an abort with
rollback runs); and the workflow reads the declarations without loading worker code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from temporalio.testing import ActivityEnvironment

from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.tools import catalogue
from perdure.activities.tools.catalogue import TOOL_MODULES, TOOL_SPECS, TOOLS
from perdure.activities.tools.catalogue.tool_base import (
    EffectCall,
    EffectTool,
    LocalCall,
    LocalTool,
    declaration_problems,
)
from perdure.activities.tools.run_tool import ToolActivities
from perdure.testing.fakes import LedgerAPI
from perdure.workflows.goal.contracts.messages import Abort
from perdure.workflows.goal.contracts.plan import parse_plan
from perdure.workflows.shared.contracts import ToolInput
from perdure.workflows.shared.effects import prepared_in_workflow
from perdure.workflows.shared.tool_specs import (
    EFFECT_KEY,
    HTTP_URL,
    REMOTE_TIMEOUTS,
    Compensation,
    Effect,
    ToolArgs,
    ToolSpec,
)
from tests.builders import gate, openai_profile
from tests.helpers import goal_result, running_worker, scheduled_activities, start, statuses, submit, wait_until

# --- a tool with a compensation, added the way the catalogue's docstring says: one module -------


class EntryArgs(ToolArgs):
    ledger: str = Field(pattern=HTTP_URL, description="The ledger API's base URL.")
    text: str = Field(min_length=1)


class RemoveEntryArgs(ToolArgs):
    ledger: str = Field(pattern=HTTP_URL)
    entry_key: str = Field(pattern=EFFECT_KEY, description="The effect key the entry was added under.")


async def _entry_with_key(ledger: str, key: str) -> dict | None:
    from perdure.activities.tools.http_calls import check_status, http_call, json_reply

    response = await http_call("GET", f"{ledger}/entries", headers={})
    check_status(response, "the ledger")
    return next((e for e in json_reply(response, "the ledger")["data"] if e.get("key") == key), None)


class AddEntry(EffectTool):
    spec = ToolSpec(
        name="add_entry",
        risk="remote-write",
        replay="keyed",
        description="Add an entry to a ledger.",
        args_model=EntryArgs,
        compensation="remove_entry",
        **REMOTE_TIMEOUTS,
    )
    example = {"ledger": "http://ledger.example", "text": "lunch"}

    def effect(self, args: EntryArgs, workspace: str) -> Effect:
        return Effect(f"{args.ledger}/entries", "add", {"text": args.text})

    def undo(self, key: str, args: EntryArgs) -> Compensation:
        return Compensation(
            tool="remove_entry", args={"ledger": args.ledger, "entry_key": key}, reason=f"remove '{args.text}'"
        )

    def target(self, args: EntryArgs) -> str:
        return args.ledger

    async def send(self, call: EffectCall, args: EntryArgs) -> dict:
        from perdure.activities.tools.http_calls import check_status, http_call, json_reply

        body = {"text": args.text, "key": call.key}
        response = await http_call("POST", f"{args.ledger}/entries", body=body, headers={"Idempotency-Key": call.key})
        check_status(response, "the ledger")
        return {"id": json_reply(response, "the ledger")["id"]}

    def describe(self, call: EffectCall, args: EntryArgs, receipt: dict) -> str:
        return f"added entry {receipt.get('id')}"


class RemoveEntry(EffectTool):
    spec = ToolSpec(
        name="remove_entry",
        risk="remote-write",
        replay="check",
        description="Remove the entry added under an effect key (a compensation).",
        args_model=RemoveEntryArgs,
        **REMOTE_TIMEOUTS,
    )
    example = {"ledger": "http://ledger.example", "entry_key": "fx-" + "0" * 32}

    def effect(self, args: RemoveEntryArgs, workspace: str) -> Effect:
        return Effect(f"{args.ledger}/entries", "remove", {"entry_key": args.entry_key})

    def target(self, args: RemoveEntryArgs) -> str:
        return args.ledger

    async def lookup(self, call: EffectCall, args: RemoveEntryArgs) -> dict | None:
        gone = await _entry_with_key(args.ledger, args.entry_key) is None
        return {"found_by": "the entry is not in the ledger"} if gone else None

    async def send(self, call: EffectCall, args: RemoveEntryArgs) -> dict:
        from perdure.activities.tools.http_calls import check_status, http_call

        entry = await _entry_with_key(args.ledger, args.entry_key)
        assert entry is not None  # the lookup found it
        check_status(await http_call("DELETE", f"{args.ledger}/entries/{entry['id']}", headers={}), "the ledger")
        return {"removed": entry["id"]}

    def describe(self, call: EffectCall, args: RemoveEntryArgs, receipt: dict) -> str:
        return f"removed entry {receipt['removed']}" if "removed" in receipt else "no such entry in the ledger"


@pytest.fixture
def ledger_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two ledger tools in the catalogue for this test, as a module listed in TOOL_MODULES puts them."""
    for tool in (AddEntry(), RemoveEntry()):
        monkeypatch.setitem(TOOLS, tool.spec.name, tool)
        monkeypatch.setitem(TOOL_SPECS, tool.spec.name, tool.spec)


# --- every declaration complete and consistent --------------------------------------------------


def test_every_built_in_tool_is_declared_complete_and_consistent_in_one_module():
    assert declaration_problems(TOOLS) == []
    for name, tool in TOOLS.items():
        module = type(tool).__module__
        assert module.removeprefix(f"{catalogue.__name__}.") in TOOL_MODULES, name
        # Its arguments, declaration and implementation live together.
        assert tool.spec.args_model.__module__ == module, name


def test_the_added_tools_are_complete_and_consistent():
    assert declaration_problems({"add_entry": AddEntry(), "remove_entry": RemoveEntry()}) == []


class _Irreversible(AddEntry):
    spec = AddEntry.spec.model_copy(update={"name": "pay", "risk": "irreversible", "replay": "safe"})


class _CheckedWithoutLookup(AddEntry):
    spec = AddEntry.spec.model_copy(update={"name": "checked", "replay": "check"})


class _UndoneByAStranger(AddEntry):
    spec = AddEntry.spec.model_copy(update={"name": "stranger", "compensation": "cancel_entry"})


class _UndoneWithWrongArguments(AddEntry):
    spec = AddEntry.spec.model_copy(update={"name": "wrong_undo"})

    def undo(self, key: str, args: EntryArgs) -> Compensation:
        return Compensation(tool="remove_entry", args={"ledger": args.ledger}, reason="remove it")


class _NoEffect(AddEntry):
    spec = AddEntry.spec.model_copy(update={"name": "no_effect"})

    def effect(self, args: EntryArgs, workspace: str) -> None:
        return None


class _LocalWrite(LocalTool):
    spec = AddEntry.spec.model_copy(update={"name": "local_write", "compensation": None})
    example = AddEntry.example

    async def run(self, call: LocalCall, args: Any) -> str:
        return ""


class _BadExample(AddEntry):
    spec = AddEntry.spec.model_copy(update={"name": "bad_example"})
    example = {"ledger": "ftp://x", "text": "t"}


@pytest.mark.parametrize(
    ("tool", "problem"),
    [
        (_Irreversible(), "pay: is irreversible but its replay is `safe`"),
        (_CheckedWithoutLookup(), "checked: replays `check` but has no lookup"),
        (_UndoneByAStranger(), "stranger: its compensation names cancel_entry, which is not a tool of the catalogue"),
        (_UndoneWithWrongArguments(), "wrong_undo: its compensation's arguments do not validate as remove_entry's"),
        (_NoEffect(), "no_effect: is remote-write but its example has no effect, so no effect key"),
        (_LocalWrite(), "local_write: is remote-write but not an EffectTool"),
        (_BadExample(), "bad_example: its example does not validate against EntryArgs"),
    ],
    ids=lambda v: v.spec.name if hasattr(v, "spec") else "",
)
def test_a_half_added_tool_is_named_with_what_it_lacks(tool, problem):
    problems = declaration_problems({tool.spec.name: tool, "remove_entry": RemoveEntry()})
    assert any(p.startswith(problem) for p in problems), problems


# --- the workflow's side reads declarations, never worker code ---------------------------------


def test_loading_the_goal_workflow_loads_no_worker_code():
    probe = (
        "import sys; import perdure.workflows.goal.goal_workflow; "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('perdure', 'httpx', 'opentelemetry', 'openai', 'anthropic', 'mcp'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    outside = [m for m in loaded if not m.startswith(("perdure.workflows", f"{catalogue.__name__}."))]
    assert outside == ["perdure", "perdure.activities", "perdure.activities.tools", catalogue.__name__]


def test_a_catalogue_module_imports_worker_code_only_where_it_runs():
    allowed = ("pydantic", "perdure.workflows", catalogue.__name__)
    wrong = []
    for path in sorted(Path(catalogue.__file__).parent.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:  # module level only
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                wrong += [
                    f"{path.name}: {n}"
                    for n in names
                    if n.split(".")[0] not in sys.stdlib_module_names and not n.startswith(allowed)
                ]
    assert wrong == []


# --- a tool added in one module reaches every side ----------------------------------------------


def entry_call(ledger: LedgerAPI, **fields) -> ToolInput:
    args = {"ledger": ledger.base_url, "text": "lunch"}
    return ToolInput(goal_id="goal-1", node_key="n:1", tool="add_entry", workspace="/ws", args=args, **fields)


async def test_an_added_tool_is_prepared_in_the_workflow_run_and_undone(ledger_tools, fake_service, tmp_path):
    ledger = fake_service(LedgerAPI)
    call = entry_call(ledger)
    prepared = prepared_in_workflow(call)
    assert prepared is not None and prepared.compensation is not None
    assert prepared.compensation.tool == "remove_entry"
    assert prepared.compensation.args == {"ledger": ledger.base_url, "entry_key": prepared.effect_key}

    tools = ToolActivities(DiskArtifactStore(tmp_path / "store"))
    added = await ActivityEnvironment().run(tools.run_tool, call)
    assert added.ok and added.effect_key == prepared.effect_key and added.compensation == prepared.compensation
    undo = prepared.compensation
    removal = call.model_copy(update={"tool": undo.tool, "args": undo.args})
    removed = await ActivityEnvironment().run(tools.run_tool, removal)
    again = await ActivityEnvironment().run(tools.run_tool, removal)  # `check`: found done, not sent again

    assert (removed.ok, removed.preview) == (True, f"removed entry {added.receipt['id']}")
    assert (again.ok, again.receipt) == (True, {"found_by": "the entry is not in the ledger"})
    ops = [(e["op"], e["idempotency_key"]) for e in ledger.ledger()]
    assert ops == [("create", prepared.effect_key), ("delete", None)]


@pytest.mark.slow
async def test_an_abort_with_rollback_runs_the_added_tools_compensation(
    ledger_tools, env, task_queue, store, workspace, scripted, fake_service
):
    ledger = fake_service(LedgerAPI)
    steps = [
        {"name": "add", "kind": "tool", "tool": "add_entry", "args": {"ledger": ledger.base_url, "text": "lunch"}},
        gate(["add"]),
    ]
    assert parse_plan({"steps": steps}, ["add_entry", "run_command"])[1] is None  # the plan check knows it
    async with running_worker(env, task_queue, store, openai_profile(scripted({"replies": []}))):
        handle = await start(env, task_queue, workspace, steps, allowed_tools=["add_entry", "run_command"])
        await wait_until(handle, lambda s: statuses(s)["gate"] == "running")
        await submit(handle, Abort(request_id="a1", reason="wrong ledger", rollback=True))
        result = await goal_result(handle)
        history = await handle.fetch_history()
    (workspace / "GO").touch()

    assert result.outcome == "aborted"
    assert [e["op"] for e in ledger.ledger()] == ["create", "delete"]
    compensations = [s for _, _, s in scheduled_activities(history) if s.startswith("compensate")]
    assert [c.split(" · ")[1] for c in compensations] == ["remove_entry"]
    assert "undo by remove_entry done" in store.get_text(result.report)
