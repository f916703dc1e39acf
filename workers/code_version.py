"""The version of the code a worker runs, as the build id it gives Temporal: a digest of
perdure's own source files, so two workers with the same code agree on it whatever else
their processes imported (the SDK's default digests every loaded module, which differs
between a `perdure worker` and a test process), and any change to the code changes it.

A goal records the versions that have run it and checks its finished work again when a
worker of another one takes it (workflows/goal/verify_due.py).
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What a worker runs: the workflow and activity code and what they import at run time.
PACKAGES = ("workflows", "activities", "workers", "runtime", "memory")


@cache
def code_version() -> str:
    digest = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return "perdure-" + digest.hexdigest()[:16]
