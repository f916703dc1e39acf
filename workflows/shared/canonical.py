"""Canonical JSON and digests: the one way perdure turns data into a stable hash.

Pure and deterministic; used by the workflow (node keys) and by activities
(artifact digests), so both sides compute identical digests.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel


def canonical_json(value: Any) -> str:
    """Serialise with sorted keys and no insignificant whitespace."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def digest_of(value: Any) -> str:
    return sha256_digest(canonical_json(value).encode("utf-8"))
