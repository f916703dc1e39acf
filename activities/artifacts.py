"""Content-addressed artifact store on local disk.

Outputs, transcripts and tool arguments live here; workflows hold only the
`ArtifactRef` (digest + size). Writes are atomic and idempotent: the same bytes
always land at the same path, so a retried activity never duplicates a blob.
Reads verify the digest.

With payload keys configured (runtime/codec.py) every file is encrypted at rest
with the newest key; the address stays the digest of the plaintext, so a blob
has one address whatever key, or none, it is kept under. Reading takes either
kind of file: one written before encryption was on is plaintext, and a put of
the same bytes with keys seals it in place. Reads of an encrypted file need its
key; the digest check runs on the decrypted bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from perdure.runtime.codec import (
    MAGIC,
    DecryptionError,
    Keyring,
    UnknownPayloadKey,
    is_sealed,
    keyring_from_env,
    seal,
    unseal,
)
from perdure.runtime.files import write_atomically
from perdure.runtime.settings import perdure_home
from perdure.workflows.shared.canonical import sha256_digest
from perdure.workflows.shared.contracts import ArtifactRef


class ArtifactMissing(LookupError):
    """The store has no blob for this digest (wrong machine, or deleted)."""


class ArtifactCorrupt(ValueError):
    """The blob on disk does not match its digest."""


_KEYS_FROM_ENV: Any = object()


class ArtifactStore:
    def __init__(self, root: Path, keyring: Keyring | None = _KEYS_FROM_ENV) -> None:
        """`keyring` defaults to the keys the environment names (none: files stay plaintext)."""
        self.root = root
        self.keyring = keyring_from_env() if keyring is _KEYS_FROM_ENV else keyring

    def _path(self, digest: str) -> Path:
        algo, _, hexdigest = digest.partition(":")
        return self.root / algo / hexdigest[:2] / hexdigest

    def put_bytes(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        digest = sha256_digest(data)
        path = self._path(digest)
        if not self._kept_as_wanted(path):
            # Two writers of one address write the same plaintext, sealed or not: the last rename wins harmlessly.
            write_atomically(path, seal(self.keyring, data) if self.keyring else data)
        return ArtifactRef(digest=digest, size=len(data), media_type=media_type)

    def _kept_as_wanted(self, path: Path) -> bool:
        """The file exists, and is encrypted if this store encrypts (a plaintext one is sealed anew)."""
        try:
            with path.open("rb") as f:
                return self.keyring is None or is_sealed(f.read(len(MAGIC)))
        except FileNotFoundError:
            return False

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
        if is_sealed(data):
            try:
                data = unseal(self.keyring, data, f"artifact {digest} at {path}")
            except UnknownPayloadKey:
                raise  # this process lacks a key another may have: not the blob's fault
            except DecryptionError as err:
                raise ArtifactCorrupt(str(err)) from None
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
