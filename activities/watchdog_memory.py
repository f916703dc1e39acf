"""The watchdog's memory on disk: one small JSON file per watched task queue,
`$PERDURE_HOME/watchdog/<task queue>.json`, replaced atomically.

Owns the path and the read/write; never decides anything. A missing or
unreadable file is not an error: the watchdog starts from an empty memory,
which costs at most a re-sent intervention that the goal's inbox dedupes.
With payload keys set the file is sealed like the artifacts (runtime/codec.py):
it names goals and quotes what they are stuck on.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import ValidationError

from runtime.codec import DecryptionError, PayloadKeyError, is_sealed, keyring_from_env, seal, unseal
from runtime.files import write_atomically
from workflows.watchdog_contracts import MEMORY_SCHEMA_VERSION, WatchdogMemory

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def memory_path(home: Path, scope: str) -> Path:
    name = _UNSAFE.sub("_", scope).lstrip(".") or "default"
    return home / "watchdog" / f"{name}.json"


def load_memory(path: Path) -> tuple[WatchdogMemory, str | None]:
    """The stored memory, or an empty one and why."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return WatchdogMemory(), f"no memory at {path} yet"
    except OSError as err:
        return WatchdogMemory(), f"cannot read {path}: {err.strerror}"
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


def save_memory(path: Path, memory: WatchdogMemory) -> None:
    """Write-then-rename, so a reader (or a crash) never sees half a file."""
    data = memory.model_dump_json(indent=1).encode("utf-8")
    keyring = keyring_from_env()
    write_atomically(path, seal(keyring, data) if keyring else data)
