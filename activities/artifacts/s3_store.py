"""The artifact store in an S3-compatible object store: one object per blob, at
`<prefix>/sha256/<first two hex digits>/<digest>` in the bucket, the same layout as on
disk, so a directory synced to a bucket (or back) stays a store. The contract
(addressing, encryption, digest checks) is store.py's; the connection, and what a
failure to reach the store says, is runtime/s3_client.py's.

A PUT replaces an object whole, so no reader sees part of one; an object already kept
as wanted is not written again (store.py reads its first bytes first).
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from perdure.activities.artifacts.store_contract import _KEYS_FROM_ENV, ArtifactStore
from perdure.runtime.codec import Keyring
from perdure.runtime.s3_client import S3Location, check_bucket, is_not_found, s3_client, unavailable

WHAT = "artifact store"


class S3ArtifactStore(ArtifactStore):
    def __init__(self, location: S3Location, keyring: Keyring | None = _KEYS_FROM_ENV, client: Any = None) -> None:
        super().__init__(keyring)
        self.location = location
        self._client = client

    @property
    def client(self) -> Any:
        # Made at first use: a store is built wherever a command might read one, most never do.
        if self._client is None:
            self._client = s3_client()
        return self._client

    @property
    def where(self) -> str:
        return self.location.url

    def check(self) -> None:
        check_bucket(self.client, self.location, WHAT)

    def key(self, digest: str) -> str:
        algo, _, hexdigest = digest.partition(":")
        return self.location.key(f"{algo}/{hexdigest[:2]}/{hexdigest}")

    def _read(self, digest: str) -> bytes | None:
        try:
            response = self.client.get_object(Bucket=self.location.bucket, Key=self.key(digest))
            return response["Body"].read()
        except (BotoCoreError, ClientError) as err:
            if is_not_found(err):
                return None
            raise unavailable(err, self.location, WHAT) from None

    def _read_head(self, digest: str, size: int) -> bytes | None:
        try:
            response = self.client.get_object(
                Bucket=self.location.bucket, Key=self.key(digest), Range=f"bytes=0-{size - 1}"
            )
            return response["Body"].read()
        except (BotoCoreError, ClientError) as err:
            if is_not_found(err):
                return None
            if isinstance(err, ClientError) and err.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""  # an empty object has no byte 0 to range over
            raise unavailable(err, self.location, WHAT) from None

    def _write(self, digest: str, blob: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.location.bucket, Key=self.key(digest), Body=blob)
        except (BotoCoreError, ClientError) as err:
            raise unavailable(err, self.location, WHAT) from None

    def _exists(self, digest: str) -> bool:
        try:
            self.client.head_object(Bucket=self.location.bucket, Key=self.key(digest))
            return True
        except (BotoCoreError, ClientError) as err:
            if is_not_found(err):
                return False
            raise unavailable(err, self.location, WHAT) from None

    def _location(self, digest: str) -> str:
        return f"s3://{self.location.bucket}/{self.key(digest)}"
