"""The one data converter of perdure: client, worker and replayer all take it
from `data_converter()`, handed to them by runtime/plugin.py's PerdurePlugin, so
what one side writes the others can read.

It is the pydantic converter plus the SDK's external storage (claim check):
any payload of at least the threshold is written to a payload store and only a
small reference goes into history. With payload keys configured
(PERDURE_PAYLOAD_KEYS or PERDURE_PAYLOAD_KEY_FILE, see runtime/codec.py) it also
has the encryption codec, and failures carry their message and stack trace as an
encrypted payload (`encoded_attributes`) instead of as plain fields: every
payload in history is then ciphertext. The SDK encrypts before it offloads, so
what reaches the payload store is ciphertext too. perdure already keeps outputs out of history
as artifact references; this is the safety net for whatever is still big (a
large plan, a grown state object), which would otherwise fail at Temporal's
2 MB payload limit or eat the 50 MB history.

PERDURE_PAYLOAD_STORE            where large payloads go:
                                 unset: beside the artifacts, $PERDURE_HOME/payloads,
                                   or s3://bucket/prefix/payloads when
                                   PERDURE_ARTIFACT_STORE is s3://bucket/prefix
                                 `disk`: $PERDURE_HOME/payloads
                                 `disk:/abs/dir`: that directory
                                 `s3://bucket[/prefix]`: an S3-compatible store, via the
                                   SDK's S3 driver on perdure's boto3 client (endpoint,
                                   credentials and region from the standard AWS
                                   variables: runtime/s3_client.py)
                                 `off`: no external storage
PERDURE_PAYLOAD_THRESHOLD_BYTES  payloads of at least this size are stored
                                 outside history, default 131072 (128 KiB)

Every worker, the CLI and any replayer must see the same store and the same
keys: a reference is useless where its payload cannot be read, a ciphertext
where its key is missing. Building the converter reads the environment (and the
key file, if one is named) and touches neither the network nor the store;
`check_payload_store()` reaches an object store's bucket once, as a worker, `perdure ui`
and `perdure mcp` do at their start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.contrib.aws.s3driver import S3StorageDriver, S3StorageDriverClient
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    ExternalStorage,
    StorageDriver,
    StorageDriverActivityInfo,
    StorageDriverSelectContext,
)

from perdure.runtime.codec import CiphertextPayloadConverter, EncryptionCodec, key_id_of, keyring_from_env
from perdure.runtime.payload_store import DiskPayloadDriver, PayloadMissing
from perdure.runtime.s3_client import (
    ObjectStoreUnavailable,
    S3Location,
    check_bucket,
    endpoint,
    is_not_found,
    parse_s3_url,
    s3_client,
    unavailable,
)
from perdure.runtime.settings import artifact_location, perdure_home
from perdure.workflows.goal.contracts.state import GoalInput, UndecryptedInput

STORE_ENV = "PERDURE_PAYLOAD_STORE"
THRESHOLD_ENV = "PERDURE_PAYLOAD_THRESHOLD_BYTES"

# Well below Temporal's 2 MB payload limit (and its 256 KB warning), and above
# anything perdure puts in history by design: outputs travel as artifact
# references and the recorded goal payloads are a few KB, so in normal operation
# nothing is offloaded and history stays readable in the UI.
DEFAULT_THRESHOLD_BYTES = 128 * 1024
# A threshold at or above the server's limit would let a payload fail before it
# is ever offloaded.
MAX_THRESHOLD_BYTES = 2 * 1024 * 1024 - 1


class PayloadStoreConfigError(ValueError):
    """PERDURE_PAYLOAD_STORE or PERDURE_PAYLOAD_THRESHOLD_BYTES has a value perdure cannot use."""


class PayloadConverter(PydanticPayloadConverter):
    """The pydantic payload converter, plus ciphertext read where no keys are configured: an
    error naming the key it needs, or for a goal's input an `UndecryptedInput`, with which
    the goal ends saying why (its workflow task would otherwise fail on it forever)."""

    def __init__(self) -> None:
        super().__init__()
        self._set_converters(*self.converters.values(), _Ciphertext())


class _Ciphertext(CiphertextPayloadConverter):
    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        if type_hint is GoalInput:
            return UndecryptedInput(key_id_of(payload))
        return super().from_payload(payload, type_hint)


def data_converter(*, payload_store: bool = True) -> DataConverter:
    """The pydantic converter, with external storage and encryption as the environment says.

    `payload_store=False` (a device daemon): every payload inline. A device shares no
    disk with the workers, so it could neither read a reference nor write one they read."""
    driver = payload_driver() if payload_store else None
    keyring = keyring_from_env()
    changes: dict[str, Any] = {}
    if driver is not None:
        changes["external_storage"] = ExternalStorage(
            drivers=[driver], driver_selector=_inline_for_devices(driver), payload_size_threshold=payload_threshold()
        )
    if keyring is not None:
        changes["payload_codec"] = EncryptionCodec(keyring)
        # A failure's message can quote a prompt or a file: it travels as a payload, so it is encrypted.
        changes["failure_converter_class"] = DefaultFailureConverterWithEncodedAttributes
    return dataclasses.replace(pydantic_data_converter, payload_converter_class=PayloadConverter, **changes)


DEVICE_ACTIVITY_PREFIX = "perdure.device."
"""Activities a device daemon runs: their inputs stay in history, never in the payload store."""


def _inline_for_devices(driver: StorageDriver) -> Callable[[StorageDriverSelectContext, Payload], StorageDriver | None]:
    def select(context: StorageDriverSelectContext, _payload: Payload) -> StorageDriver | None:
        target = context.target
        if isinstance(target, StorageDriverActivityInfo) and (target.type or "").startswith(DEVICE_ACTIVITY_PREFIX):
            return None
        return driver

    return select


def payload_driver() -> StorageDriver | None:
    where = payload_location()
    if isinstance(where, S3Location):
        return _s3_driver(where)
    return DiskPayloadDriver(where) if where is not None else None


def payload_location() -> Path | S3Location | None:
    """Where large payloads go (PERDURE_PAYLOAD_STORE): a directory, a bucket and prefix, or
    None (off). Reads the setting only; PayloadStoreConfigError for one that cannot be used."""
    value = os.environ.get(STORE_ENV, "").strip()
    if not value:
        # Where the artifacts are: hosts that share no disk share the object store.
        artifacts = artifact_location()
        if isinstance(artifacts, S3Location):
            return artifacts.under("payloads")
        return perdure_home() / "payloads"
    if value == "disk":
        return perdure_home() / "payloads"
    if value == "off":
        return None
    if value.startswith("disk:"):
        directory = Path(value.removeprefix("disk:")).expanduser()
        if not directory.is_absolute():
            raise PayloadStoreConfigError(
                f"{STORE_ENV}={value!r}: the directory must be an absolute path, so that workers "
                "and the CLI resolve it the same way"
            )
        return directory
    if value.startswith("s3://"):
        try:
            return parse_s3_url(value, STORE_ENV)
        except ValueError as err:
            raise PayloadStoreConfigError(str(err)) from None
    raise PayloadStoreConfigError(
        f"{STORE_ENV}={value!r} is not understood; use disk, disk:/absolute/dir, s3://bucket[/prefix] or off"
    )


def check_payload_store() -> None:
    """Reach an object store's bucket once (blocking): ObjectStoreUnavailable saying why it
    cannot be used. A directory has nothing to reach (its first write says so)."""
    where = payload_location()
    if isinstance(where, S3Location):
        check_bucket(s3_client(), where, "payload store")


def store_failure_in(err: BaseException) -> ObjectStoreUnavailable | PayloadMissing | None:
    """The store's own error behind `err`, if one is: the SDK's S3 driver wraps what a payload
    read raised in a RuntimeError that names the object but not why."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ObjectStoreUnavailable | PayloadMissing):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def payload_threshold() -> int:
    value = os.environ.get(THRESHOLD_ENV, "").strip()
    if not value:
        return DEFAULT_THRESHOLD_BYTES
    try:
        threshold = int(value)
    except ValueError:
        raise PayloadStoreConfigError(f"{THRESHOLD_ENV}={value!r} is not a whole number of bytes") from None
    if not 0 <= threshold <= MAX_THRESHOLD_BYTES:
        raise PayloadStoreConfigError(
            f"{THRESHOLD_ENV}={value!r} is out of range: use 0 (store every payload) up to "
            f"{MAX_THRESHOLD_BYTES} (just under Temporal's 2 MB payload limit)"
        )
    return threshold


def _s3_driver(location: S3Location) -> StorageDriver:
    return S3StorageDriver(client=_PrefixedS3Client(location), bucket=location.bucket)


class _PrefixedS3Client(S3StorageDriverClient):
    """The SDK's S3 driver client on perdure's boto3 client (runtime/s3_client.py, the one
    the artifact store uses), keys under a prefix, each call in a thread: boto3 blocks, and
    these calls run on the event loop that runs workflow tasks. The client is made at the
    first call: building the converter touches no network and imports no boto3. A failure
    to reach the store is ObjectStoreUnavailable, saying why (the SDK names the object)."""

    def __init__(self, location: S3Location) -> None:
        self._location = location

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        await self._call(lambda s3: s3.put_object(Bucket=bucket, Key=self._location.key(key), Body=data))

    async def object_exists(self, *, bucket: str, key: str) -> bool:
        head = lambda s3: bool(s3.head_object(Bucket=bucket, Key=self._location.key(key)))  # noqa: E731
        return await self._call(head, absent=False)

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        data = await self._call(
            lambda s3: s3.get_object(Bucket=bucket, Key=self._location.key(key))["Body"].read(), absent=b""
        )
        if data == b"":  # no serialized Payload is empty: the object is not there
            raise PayloadMissing(
                f"payload {self._location.key(key)} is not in the payload store s3://{bucket}. "
                f"Every worker and the CLI must use the same {STORE_ENV} (unset, it follows PERDURE_ARTIFACT_STORE)."
            )
        return data

    async def _call(self, call: Callable[[Any], Any], absent: Any = None) -> Any:
        """`call` on the client in a thread; `absent` (when given) is the answer for no such object."""

        def blocking() -> Any:
            from botocore.exceptions import BotoCoreError, ClientError

            try:
                return call(s3_client())
            except (BotoCoreError, ClientError) as err:
                if absent is not None and is_not_found(err):
                    return absent
                raise unavailable(err, self._location, "payload store") from None

        return await asyncio.to_thread(blocking)

    def describe(self) -> Mapping[str, str]:
        # Appended by the SDK to a failure's message: where it went, never a credential.
        return {"endpoint": endpoint() or "AWS S3"}
