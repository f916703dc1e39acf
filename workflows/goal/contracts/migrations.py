"""Loading a carried goal state written by another version of this code. Pure.

Continue-as-new carries the goal's whole state as JSON text (earlier versions:
a plain mapping). A state of
an older `schema_version` goes through the migration functions below, one
version at a time; a state this code cannot read (unknown fields, invalid
values, no migration) is refused with the reason, never half-loaded. A state
from newer code is neither: it waits for a worker that has that code
(StateFromNewerCode).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from perdure.workflows.goal.contracts.plan import describe_validation_error
from perdure.workflows.goal.contracts.state import SCHEMA_VERSION, GoalState


class StateRefused(ValueError):
    """The carried state cannot be loaded; the message says why."""


class StateFromNewerCode(Exception):
    """The carried state was written by newer code: not a fault of the goal but of
    which worker took it (a rolling deploy). Not a StateRefused, on purpose: the
    goal must not park for good over it. Raised from the workflow, it fails the
    workflow task, which Temporal retries until a worker with the newer code takes it."""


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    # v1 had no goal-level premises: they lived only in the spec. Defaulting the
    # new field to {} would silently drop them, so copy them over.
    spec = data.get("spec") or {}
    return {**data, "premises": dict(spec.get("premises") or {}), "schema_version": 2}


def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    # v3 lets a plan version omit a plan equal to the one before; v2 always wrote it
    # out, which v3 still reads. Only the version changes. (A v2 worker cannot decode
    # a v3 run's input at all, the state being text: its workflow task fails and is
    # retried until a v3 worker takes it, as with StateFromNewerCode below.)
    return {**data, "schema_version": 3}


def _v3_to_v4(data: dict[str, Any]) -> dict[str, Any]:
    # v4 keeps the work a plan change left out (`retired_nodes`). v3 dropped those nodes
    # from the state when the plan changed, so what a v3 run dropped is gone: the list
    # starts empty and that goal's report shows its current plan's work only, as before.
    return {"retired_nodes": [], **data, "schema_version": 4}


def _v4_to_v5(data: dict[str, Any]) -> dict[str, Any]:
    # v5 records effects before they are sent (compensations know whether their effect
    # happened; `effects` keeps the writes that happened, by key) and lets a tool step
    # wait for a person as state (`waiting_on`, a question's `effect_key`). A v4 run
    # recorded compensations only after their effect succeeded: those happened.
    return {"effects": {}, **data, "schema_version": 5}


def _v5_to_v6(data: dict[str, Any]) -> dict[str, Any]:
    # v6 knows devices: the presence of those the plan names, nodes waiting for one
    # (status `offline`), the device a person moved a node to. A v5 goal had none.
    return {**data, "schema_version": 6}


def _v6_to_v7(data: dict[str, Any]) -> dict[str, Any]:
    # v7 checks finished work after a long wait: nodes keep the fingerprints of what they
    # read and wrote, the pause when it began, the goal its checks. A v6 node recorded no
    # fingerprints, so a check of it goes only as deep as its artifacts.
    return {**data, "schema_version": 7}


def _v7_to_v8(data: dict[str, Any]) -> dict[str, Any]:
    # v8 re-plans on evidence: the goal keeps the conclusions its steps stated and the
    # outcomes it judges (`evidence`), and a plan version may come from `evidence`; nodes
    # may be subgoals (`child`). A v7 goal had none: it starts judging from here.
    return {**data, "schema_version": 8}


def _v8_to_v9(data: dict[str, Any]) -> dict[str, Any]:
    # v9 carries the patches its runs have (`patches`: a continued run takes them from its
    # input instead of recording markers again), the build ids that ran it, a subgoal's
    # granted budget, memory ids and statements on nodes, and what a check left unchecked.
    # A v8 goal had none of these: every default means "not yet", so only the version changes.
    return {**data, "schema_version": 9}


def _v9_to_v10(data: dict[str, Any]) -> dict[str, Any]:
    # v10 keeps the catalogue of the MCP servers a goal names (`mcp`). A v9 goal named
    # none it could use: None means "not listed", so only the version changes.
    return {**data, "schema_version": 10}


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: _v1_to_v2,
    2: _v2_to_v3,
    3: _v3_to_v4,
    4: _v4_to_v5,
    5: _v5_to_v6,
    6: _v6_to_v7,
    7: _v7_to_v8,
    8: _v8_to_v9,
    9: _v9_to_v10,
}


def load_state(data: Any) -> GoalState:
    with _collector_paused():
        return _load(data)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Loading builds some twenty objects per node at once, and Python's collector
    would meanwhile walk the worker's whole heap again every 700 of them: a
    10,000-node state took 0.8-1.5 s to load (more the more the worker holds)
    instead of about 0.5 s, where the SDK allows 2 s for the whole workflow task.
    Paused for the load only (memory is reclaimed by reference counting meanwhile,
    cycles at the next collection); it plays no part in what the workflow decides.
    Tuning the collector for the whole worker instead cost 30-50 % more memory."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _load(data: Any) -> GoalState:
    if isinstance(data, str):
        return _load_text(data)
    if not isinstance(data, dict):
        raise StateRefused(f"the carried state is a {type(data).__name__}, not a mapping")
    version = data.get("schema_version")
    if not isinstance(version, int):
        raise StateRefused("the carried state has no integer schema_version")
    if version > SCHEMA_VERSION:
        raise StateFromNewerCode(
            f"the carried state is schema v{version}, newer than this worker's v{SCHEMA_VERSION}; "
            "this workflow task is retried until a worker with the newer code takes it"
        )
    while version < SCHEMA_VERSION:
        migrate = MIGRATIONS.get(version)
        if migrate is None:
            raise StateRefused(f"no migration from schema v{version} to v{version + 1}")
        data = migrate(data)
        version = data["schema_version"]
    try:
        return GoalState.model_validate(data)
    except ValidationError as err:
        raise StateRefused(
            f"the carried state does not fit schema v{SCHEMA_VERSION}: {describe_validation_error(err)}"
        ) from None


def _load_text(text: str) -> GoalState:
    """A state carried as JSON text, as this version writes it: a current one is
    validated straight from the text; an older or damaged one goes through the
    mapping path above, to be migrated or refused with the reason."""
    try:
        state = GoalState.model_validate_json(text)
    except ValidationError:
        state = None
    if state is not None and state.schema_version == SCHEMA_VERSION:
        return state
    try:
        data = json.loads(text)
    except ValueError as err:
        raise StateRefused(f"the carried state is not JSON: {err}") from None
    return _load(data)
