"""Loading a carried goal state written by another version of this code. Pure.

Continue-as-new carries the goal's whole state as JSON text. A state of an older
`schema_version` goes through the migration functions in MIGRATIONS, one version at
a time; a state this code cannot read (unknown fields, invalid values, no migration)
is refused with the reason, never half-loaded. A state from newer code is neither:
it waits for a worker that has that code (StateFromNewerCode).

Versions are "MAJOR.MINOR" text and restart at perdure 1.0 ("1.0"). Text, not the
integer the development versions counted up to 10: a state carried by code before 1.0
has an integer version, which this loader refuses with that reason instead of taking
it for a newer 1.x state and waiting for ever. No pre-1.0 state is read (worker
deployment versions pin a running goal to the code that started it, so none reaches
1.0 code), and MIGRATIONS starts empty: a change to GoalState that a running chain
must carry across continue-as-new bumps SCHEMA_VERSION and adds the step from the
version before it here, with a test that loads a state of that version.
"""

from __future__ import annotations

import gc
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from perdure.workflows.goal.contracts.plan import describe_validation_error
from perdure.workflows.goal.contracts.state import SCHEMA_VERSION, GoalState

VERSION = re.compile(r"(\d+)\.(\d+)")


class StateRefused(ValueError):
    """The carried state cannot be loaded; the message says why."""


class StateFromNewerCode(Exception):
    """The carried state was written by newer code: not a fault of the goal but of
    which worker took it (a rolling deploy). Not a StateRefused, on purpose: the
    goal must not park for good over it. Raised from the workflow, it fails the
    workflow task, which Temporal retries until a worker with the newer code takes it."""


# Version -> the step that turns a state of that version into one of the next.
MIGRATIONS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def load_state(data: Any) -> GoalState:
    with collector_paused():
        return _load(data)


def version_key(version: Any) -> tuple[int, int] | None:
    """A "MAJOR.MINOR" version as numbers to compare, or None when it is not one."""
    found = VERSION.fullmatch(version) if isinstance(version, str) else None
    return (int(found[1]), int(found[2])) if found else None


@contextmanager
def collector_paused() -> Iterator[None]:
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
    if isinstance(version, int) and not isinstance(version, bool):
        raise StateRefused(
            f"the carried state is schema v{version}, written by perdure before 1.0, which this version does not read"
        )
    found, current = version_key(version), version_key(SCHEMA_VERSION)
    assert current is not None
    if found is None:
        raise StateRefused('the carried state has no schema_version of the form "MAJOR.MINOR"')
    if found > current:
        raise StateFromNewerCode(
            f"the carried state is schema v{version}, newer than this worker's v{SCHEMA_VERSION}; "
            "this workflow task is retried until a worker with the newer code takes it"
        )
    while found < current:
        migrate = MIGRATIONS.get(version)
        if migrate is None:
            raise StateRefused(f"no migration from schema v{version} to v{SCHEMA_VERSION}")
        data = migrate(data)
        after = version_key(data.get("schema_version"))
        if after is None or after <= found:
            raise StateRefused(f"the migration from schema v{version} did not move the state on")
        version, found = data["schema_version"], after
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
