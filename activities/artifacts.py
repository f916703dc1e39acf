"""Content-addressed artifact store on local disk.

Outputs, transcripts and tool arguments live here; workflows hold only the
`ArtifactRef` (digest + size). Writes are atomic and idempotent: the same bytes
always land at the same path, so a retried activity never duplicates a blob.
Reads verify the digest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runtime.files import write_once
from runtime.settings import perdure_home
from workflows.canonical import sha256_digest
from workflows.contracts import ArtifactRef


class ArtifactMissing(LookupError):
    """The store has no blob for this digest (wrong machine, or deleted)."""


class ArtifactCorrupt(ValueError):
    """The blob on disk does not match its digest."""


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, digest: str) -> Path:
        algo, _, hexdigest = digest.partition(":")
        return self.root / algo / hexdigest[:2] / hexdigest

    def put_bytes(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        digest = sha256_digest(data)
        write_once(self._path(digest), data)
        return ArtifactRef(digest=digest, size=len(data), media_type=media_type)

    def put_text(self, text: str, media_type: str = "text/plain") -> ArtifactRef:
        return self.put_bytes(text.encode("utf-8"), media_type)

    def put_json(self, value: Any) -> ArtifactRef:
        return self.put_bytes(json.dumps(value, ensure_ascii=False, indent=1).encode("utf-8"), "application/json")

    def get_bytes(self, ref: ArtifactRef | str) -> bytes:
        digest = ref if isinstance(ref, str) else ref.digest
        path = self._path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ArtifactMissing(f"artifact {digest} is not in the store at {self.root}") from None
        if sha256_digest(data) != digest:
            raise ArtifactCorrupt(f"artifact {digest} at {path} does not match its digest")
        return data

    def get_text(self, ref: ArtifactRef | str) -> str:
        return self.get_bytes(ref).decode("utf-8", errors="replace")

    def get_json(self, ref: ArtifactRef | str) -> Any:
        return json.loads(self.get_bytes(ref))

    def has(self, ref: ArtifactRef | str) -> bool:
        digest = ref if isinstance(ref, str) else ref.digest
        return self._path(digest).exists()


def default_store() -> ArtifactStore:
    return ArtifactStore(perdure_home() / "artifacts")


def preview(text: str, limit: int = 200) -> str:
    """A short single-paragraph excerpt for progress views and history summaries."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
