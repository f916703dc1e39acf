"""The watchdog's memory: one small JSON file per watched task queue, `<task queue>.json`,
replaced whole; and its rule book beside it, `<task queue>.rules.json`, changed only by
`perdure watchdog set` (and `ask`). Where the two are kept (beside an object store's
artifacts, else PERDURE_HOME/watchdog) is watchdog_files.py's.

Owns what is in them and their read/write; never decides anything. A missing or
unreadable memory is not an error: the watchdog starts from an empty memory,
which costs at most a re-sent intervention that the goal's inbox dedupes.
With payload keys set both are sealed like the artifacts (runtime/codec.py):
they name goals and quote what they are stuck on.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pydantic import ValidationError

from perdure.activities.watchdog.watchdog_files import DIRECTORY, DiskFile, WatchdogFile, file_name
from perdure.runtime.codec import DecryptionError, PayloadKeyError, is_sealed, keyring_from_env, seal, unseal
from perdure.workflows.watchdog.watchdog_contracts import (
    MEMORY_SCHEMA_VERSION,
    RULES_SCHEMA_VERSION,
    RuleBook,
    RuleChange,
    WatchdogMemory,
    WatchdogRules,
)


def memory_path(home: Path, scope: str) -> Path:
    """The memory's file under a home (watchdog_files.py says when it is there)."""
    return home / DIRECTORY / file_name(scope, ".json")


def _as_file(kept: WatchdogFile | Path) -> WatchdogFile:
    return DiskFile(kept) if isinstance(kept, Path) else kept


def load_memory(kept: WatchdogFile | Path) -> tuple[WatchdogMemory, str | None]:
    """The stored memory, or an empty one and why. ObjectStoreUnavailable when the object
    store does not answer: the run fails and is retried, rather than forget what it knew."""
    kept = _as_file(kept)
    path = kept.where
    try:
        raw = kept.read()
    except OSError as err:
        return WatchdogMemory(), f"cannot read {path}: {err.strerror}"
    if raw is None:
        return WatchdogMemory(), f"no memory at {path} yet"
    return parse_memory(raw, path)


def parse_memory(raw: bytes, path: str) -> tuple[WatchdogMemory, str | None]:
    """The memory in `raw` (read from `path`), or an empty one and why."""
    try:
        text = unseal(keyring_from_env(), raw, str(path)) if is_sealed(raw) else raw
    except (DecryptionError, PayloadKeyError) as err:
        return WatchdogMemory(), f"{err}; starting afresh"
    try:
        memory = WatchdogMemory.model_validate_json(text)
    except ValidationError as err:
        return WatchdogMemory(), f"{path} is unreadable ({err.error_count()} problem(s)); starting afresh"
    if memory.schema_version != MEMORY_SCHEMA_VERSION:
        return WatchdogMemory(), f"{path} has schema version {memory.schema_version}; starting afresh"
    return memory, None


def save_memory(kept: WatchdogFile | Path, memory: WatchdogMemory) -> None:
    """Written whole, so a reader (or a crash) never sees half a file."""
    data = memory.model_dump_json(indent=1).encode("utf-8")
    keyring = keyring_from_env()
    _as_file(kept).write(seal(keyring, data) if keyring else data)


# --- the rule book: the maintainers' rules, durable and versioned ---------------------
#
# A file beside the memory and not in it: the memory is derived and is dropped when it
# cannot be read, while a rule a maintainer set must never be reset by anything but
# another `perdure watchdog set`. Not the schedule's input either, which every worker
# start rewrites. A long-lived workflow would make the rules reachable from any
# machine, at the price of an update per change and a query per run; the file costs
# neither and lives where every worker and command reaches it (watchdog_files.py).


class RuleError(ValueError):
    """A rule change that cannot be made: unknown rule, wrong type, out of range, bad scope."""


SETTABLE_RULES = tuple(WatchdogRules.model_fields)
_UNSET = ("default", "unset", "none")


def rules_path(home: Path, scope: str) -> Path:
    """The rule book's file under a home (watchdog_files.py says when it is there)."""
    return home / DIRECTORY / file_name(scope, ".rules.json")


def load_rules(kept: WatchdogFile | Path) -> tuple[RuleBook, str | None]:
    """The stored rule book, or an empty one and why (nothing set yet, or unreadable).
    ObjectStoreUnavailable when the object store does not answer: never judge by defaults
    a maintainer may have changed."""
    kept = _as_file(kept)
    try:
        raw = kept.read()
    except OSError as err:
        return RuleBook(), f"cannot read the watchdog's rules at {kept.where}: {err.strerror}; using the defaults"
    return _rules_of(raw, kept.where)


def _rules_of(raw: bytes | None, path: str) -> tuple[RuleBook, str | None]:
    if raw is None:
        return RuleBook(), None
    try:
        text = unseal(keyring_from_env(), raw, str(path)) if is_sealed(raw) else raw
        book = RuleBook.model_validate_json(text)
    except (DecryptionError, PayloadKeyError, ValidationError) as err:
        return RuleBook(), f"the watchdog's rules at {path} are unreadable ({err}); using the defaults"
    if book.schema_version != RULES_SCHEMA_VERSION:
        return RuleBook(), f"{path} has rules schema version {book.schema_version}; using the defaults"
    return book, None


def parse_scope(raw: str | None) -> str:
    if raw is None or raw.strip() in ("", "all"):
        return "all"
    kind, sep, value = raw.strip().partition("=")
    if not sep or kind not in ("tag", "goal") or not value:
        raise RuleError(f"--for takes tag=NAME or goal=ID, not {raw!r}")
    return f"{kind}={value}"


def parse_assignment(text: str) -> tuple[str, float | int | str | None]:
    """`rule=value` with the value of the rule's type; `rule=default` removes the setting."""
    rule, sep, raw = text.partition("=")
    rule, raw = rule.strip(), raw.strip()
    if not sep or not rule:
        raise RuleError(f"expected rule=value, not {text!r}")
    if rule not in SETTABLE_RULES:
        raise RuleError(f"unknown rule {rule!r}; the rules are: {', '.join(SETTABLE_RULES)}")
    if raw.lower() in _UNSET:
        return rule, None
    try:
        checked = WatchdogRules.model_validate({rule: raw})
    except ValidationError as err:
        problem = err.errors()[0]
        raise RuleError(f"{rule}={raw}: {problem['msg'].lower()}") from None
    return rule, getattr(checked, rule)


def change_rules(
    kept: WatchdogFile | Path,
    scope: str,
    changes: list[tuple[str, float | int | str | None]],
    user: str,
    now: datetime,
) -> tuple[RuleBook, list[RuleChange]]:
    """Apply `changes` to the rule book with no other change in between, one new version per
    changed rule."""
    kept = _as_file(kept)
    outcome: tuple[RuleBook, list[RuleChange]] = (RuleBook(), [])

    def edit(raw: bytes | None) -> bytes | None:
        nonlocal outcome
        book, note = _rules_of(raw, kept.where)
        if note is not None:
            raise RuleError(f"{note}; not overwriting it")
        current = dict(book.scopes.get(scope, {}))
        made: list[RuleChange] = []
        for rule, value in changes:
            old = current.get(rule)
            if old == value:
                continue
            if value is None:
                current.pop(rule, None)
            else:
                current[rule] = value
            book.version += 1
            made.append(RuleChange(version=book.version, at=now, user=user, scope=scope, rule=rule, old=old, new=value))
        try:
            WatchdogRules.model_validate(current)
        except ValidationError as err:
            raise RuleError(str(err.errors()[0]["msg"])) from None
        if current:
            book.scopes[scope] = current
        else:
            book.scopes.pop(scope, None)
        book.history.extend(made)
        outcome = (book, made)
        if not made:
            return None
        data = book.model_dump_json(indent=1).encode("utf-8")
        keyring = keyring_from_env()
        return seal(keyring, data) if keyring else data

    kept.change(edit)
    return outcome
