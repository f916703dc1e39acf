"""The version of the code a worker runs, as the build id it gives Temporal: a digest of
perdure's own source files, so two workers with the same code agree on it whatever else
their processes imported (the SDK's default digests every loaded module, which differs
between a `perdure worker` and a test process), and any change to the code changes it.

A goal records the versions that have run it and checks its finished work again when a
worker of another one takes it (workflows/goal/verify_due.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
from functools import cache
from pathlib import Path

# What a worker runs: the workflow and activity code and what they import at run time. Read where
# the packages are (a checkout's folders for an editable install, site-packages for a wheel), so a
# checkout and a wheel of the same code agree.
PACKAGES = ("perdure.workflows", "perdure.activities", "perdure.workers", "perdure.runtime", "perdure.memory")


@cache
def code_version() -> str:
    digest = hashlib.sha256()
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin is not None, package
        root = Path(spec.origin).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(f"{package}/{path.relative_to(root).as_posix()}".encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return "perdure-" + digest.hexdigest()[:16]
