"""Write-then-rename: a reader, or a crash, sees the old file or the whole new one, never half of it.

Plain blocking file I/O for activities, workers and the CLI (call it off the event
loop where that matters). Workflow code must not import this module.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Replace `path` with `data` through a temp file in the same directory, fsynced before the rename.

    `mode` sets the file's permission bits; without it the file keeps mkstemp's 0600.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # Hidden, and named after its target, so a leftover from a killed process explains itself.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_once(path: Path, data: bytes) -> None:
    """Write a content-addressed file unless it exists. Two writers of the same name
    write the same bytes, so the last rename wins harmlessly."""
    if path.exists():
        return
    write_atomically(path, data)
