"""A Temporal `StorageDriver` that keeps large payloads on local disk.

The SDK's external storage hands every payload above a size threshold to this
driver and writes only the returned claim into history. Files are
content-addressed (sha256 of the serialized `Payload`), written atomically
(temp file, fsync, rename) and never rewritten, so a retried workflow task or
activity stores the same bytes once. Retrieval verifies the digest. The
directory must be shared by every worker and by the CLI (see
runtime/converter.py); this module does no configuration and no deletion.

It does no encryption either, and needs none: with payload keys configured the
SDK runs the codec (runtime/codec.py) before external storage, so every payload
handed to this driver is already ciphertext (`encoding: binary/encrypted`) and
each file holds one. Its random nonce makes a re-encoded payload a new file.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from pathlib import Path

from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)

from perdure.runtime.files import write_once

DRIVER_NAME = "perdure.disk"
"""Written into every reference in history: renaming it orphans stored payloads."""


class PayloadMissing(LookupError):
    """A reference in history points at a payload file that is not in the store."""


class PayloadCorrupt(ValueError):
    """A payload file does not hash to the digest its reference names."""


class DiskPayloadDriver(StorageDriver):
    def __init__(self, root: Path) -> None:
        self.root = root

    def name(self) -> str:
        return DRIVER_NAME

    def type(self) -> str:
        return DRIVER_NAME

    def path_for(self, claim: StorageDriverClaim) -> Path:
        algorithm = claim.claim_data.get("hash_algorithm")
        digest = claim.claim_data.get("hash_value", "")
        if algorithm != "sha256" or len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise PayloadCorrupt(f"not a {DRIVER_NAME} claim: {dict(claim.claim_data)}")
        return self.root / "sha256" / digest[:2] / digest

    async def store(self, context: StorageDriverStoreContext, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        # Blocking file I/O (with fsync) off the event loop that runs workflow tasks.
        return await asyncio.to_thread(lambda: [self._store_one(p.SerializeToString()) for p in payloads])

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        return await asyncio.to_thread(lambda: [self._retrieve_one(c) for c in claims])

    def _store_one(self, data: bytes) -> StorageDriverClaim:
        claim = StorageDriverClaim(
            claim_data={"hash_algorithm": "sha256", "hash_value": hashlib.sha256(data).hexdigest()}
        )
        write_once(self.path_for(claim), data)
        return claim

    def _retrieve_one(self, claim: StorageDriverClaim) -> Payload:
        path = self.path_for(claim)
        expected = claim.claim_data["hash_value"]
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise PayloadMissing(
                f"payload sha256:{expected} is not in the payload store: {path} does not exist. "
                "Every worker and the CLI must use the same PERDURE_PAYLOAD_STORE."
            ) from None
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise PayloadCorrupt(f"payload file {path} is corrupt: expected sha256:{expected}, got sha256:{actual}")
        payload = Payload()
        payload.ParseFromString(data)
        return payload
