"""The artifact store's contract: content addressing, encryption at rest, digest checks.

Outputs, transcripts and tool arguments live in the store; workflows hold only the
`ArtifactRef` (digest + size). The address of a blob is the sha256 digest of its
plaintext, so a blob has one address whatever key, or none, it is kept under, and
puts are idempotent: a put of bytes already kept as wanted writes nothing, so a
retried activity never duplicates a blob. Reads verify the digest.

With payload keys configured (runtime/codec.py) every blob is encrypted at rest
with the newest key. Reading takes either kind: one written before encryption was
on is plaintext, and a put of the same bytes with keys seals it in place. Reads of
an encrypted blob need its key; the digest check runs on the decrypted bytes.

This class owns those rules and nothing about where bytes live: a backend
(disk_store.py, s3_store.py) reads, writes and tests for one blob by its address.

Every call blocks (a file, or a network round trip to an object store, up to its read
timeout). An activity runs on the worker's event loop, which also sends every other
activity's heartbeats, so activities use the `a`-prefixed twins (`aput_text`,
`aget_text`...), which run the blocking call in a thread; a blocking call made on the
loop inside an activity warns `StoreCallOnLoop` (an error in the tests). The blocking
ones are for the CLI, threads and code already off the loop.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import warnings
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from temporalio import activity

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
from perdure.workflows.shared.canonical import sha256_digest
from perdure.workflows.shared.contracts import ArtifactRef

ADDRESS = re.compile(r"^sha256:[0-9a-f]{64}$")
"""What an artifact's address looks like; anything else (a model's guess) names no blob."""


class ArtifactMissing(LookupError):
    """The store has no blob for this digest (wrong machine, or deleted)."""


class ArtifactCorrupt(ValueError):
    """The blob kept does not match its digest."""


class StoreCallOnLoop(RuntimeWarning):
    """A blocking store call on an activity's event loop: every other activity on the worker
    stops heartbeating until it returns (use the store's `a`-prefixed method)."""


def _off_the_loop(what: str) -> None:
    """Warn when a blocking call runs on the event loop of an activity (in a thread, or
    outside any activity, it is where it should be)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    if activity.in_activity():
        # Pointed at the caller outside this module: the warning is shown once per call site.
        level, frame = 2, sys._getframe(1)
        while frame.f_back is not None and frame.f_code.co_filename == __file__:
            level, frame = level + 1, frame.f_back
        warnings.warn(
            f"artifact store {what} blocks the event loop of activity {activity.info().activity_type}",
            StoreCallOnLoop,
            stacklevel=level,
        )


_KEYS_FROM_ENV: Any = object()


class ArtifactStore(ABC):
    def __init__(self, keyring: Keyring | None = _KEYS_FROM_ENV) -> None:
        """`keyring` defaults to the keys the environment names (none: blobs stay plaintext)."""
        self.keyring = keyring_from_env() if keyring is _KEYS_FROM_ENV else keyring

    # --- what a backend provides -------------------------------------------------------

    @property
    @abstractmethod
    def where(self) -> str:
        """The store as messages name it: a directory, or s3://bucket/prefix."""

    @property
    def local_dir(self) -> Path | None:
        """The store's directory on this machine (what command sandboxes mask), if it has one."""
        return None

    @abstractmethod
    def check(self) -> None:
        """Reach the store once, so that a worker or a command that cannot use it says so
        at its start, in one line (runtime/s3_client.py ObjectStoreUnavailable)."""

    @abstractmethod
    def _read(self, digest: str) -> bytes | None:
        """The blob kept at `digest`, None when there is none."""

    @abstractmethod
    def _read_head(self, digest: str, size: int) -> bytes | None:
        """The first `size` bytes of the blob (fewer if it is shorter), None when there is none."""

    @abstractmethod
    def _write(self, digest: str, blob: bytes) -> None:
        """Keep `blob` at `digest`, replacing what is there, with no reader ever seeing part of it."""

    @abstractmethod
    def _exists(self, digest: str) -> bool: ...

    @abstractmethod
    def _location(self, digest: str) -> str:
        """Where the blob is, for a message (a path, an s3:// URL)."""

    # --- the contract ------------------------------------------------------------------

    def put_bytes(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        _off_the_loop("put")
        digest = sha256_digest(data)
        if not self._kept_as_wanted(digest):
            # Two writers of one address write the same plaintext, sealed or not: the last write wins harmlessly.
            self._write(digest, seal(self.keyring, data) if self.keyring else data)
        return ArtifactRef(digest=digest, size=len(data), media_type=media_type)

    def _kept_as_wanted(self, digest: str) -> bool:
        """The blob exists, and is encrypted if this store encrypts (a plaintext one is sealed anew)."""
        head = self._read_head(digest, len(MAGIC))
        return head is not None and (self.keyring is None or is_sealed(head))

    def put_text(self, text: str, media_type: str = "text/plain") -> ArtifactRef:
        return self.put_bytes(text.encode("utf-8"), media_type)

    def put_json(self, value: Any) -> ArtifactRef:
        return self.put_bytes(json.dumps(value, ensure_ascii=False, indent=1).encode("utf-8"), "application/json")

    def get_bytes(self, ref: ArtifactRef | str) -> bytes:
        _off_the_loop("get")
        digest = ref if isinstance(ref, str) else ref.digest
        data = self._read(digest) if ADDRESS.match(digest) else None
        if data is None:
            raise ArtifactMissing(f"artifact {digest} is not in the store at {self.where}")
        if is_sealed(data):
            try:
                data = unseal(self.keyring, data, f"artifact {digest} at {self._location(digest)}")
            except UnknownPayloadKey:
                raise  # this process lacks a key another may have: not the blob's fault
            except DecryptionError as err:
                raise ArtifactCorrupt(str(err)) from None
        if sha256_digest(data) != digest:
            raise ArtifactCorrupt(f"artifact {digest} at {self._location(digest)} does not match its digest")
        return data

    def get_text(self, ref: ArtifactRef | str) -> str:
        return self.get_bytes(ref).decode("utf-8", errors="replace")

    def get_json(self, ref: ArtifactRef | str) -> Any:
        return json.loads(self.get_bytes(ref))

    def has(self, ref: ArtifactRef | str) -> bool:
        _off_the_loop("has")
        digest = ref if isinstance(ref, str) else ref.digest
        return bool(ADDRESS.match(digest)) and self._exists(digest)

    # --- the same, for async code: the blocking call in a thread ---------------------------

    async def aput_bytes(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        return await asyncio.to_thread(self.put_bytes, data, media_type)

    async def aput_text(self, text: str, media_type: str = "text/plain") -> ArtifactRef:
        return await asyncio.to_thread(self.put_text, text, media_type)

    async def aput_json(self, value: Any) -> ArtifactRef:
        return await asyncio.to_thread(self.put_json, value)

    async def aget_bytes(self, ref: ArtifactRef | str) -> bytes:
        return await asyncio.to_thread(self.get_bytes, ref)

    async def aget_text(self, ref: ArtifactRef | str) -> str:
        return await asyncio.to_thread(self.get_text, ref)

    async def aget_json(self, ref: ArtifactRef | str) -> Any:
        return await asyncio.to_thread(self.get_json, ref)

    async def ahas(self, ref: ArtifactRef | str) -> bool:
        return await asyncio.to_thread(self.has, ref)


def preview(text: str, limit: int = 200) -> str:
    """A short single-paragraph excerpt for progress views and history summaries."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
