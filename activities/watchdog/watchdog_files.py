"""Where the watchdog keeps its memory and its rule book (watchdog_memory.py owns what is in
them). With the artifacts in an object store, beside them in its bucket, at
`<artifact prefix>/watchdog/<task queue>.json` and `.rules.json`: every worker and every
`perdure watchdog` command reads the same two, whatever host it runs on. Otherwise under
PERDURE_HOME/watchdog/ (one machine, or a home the hosts share), as the large payloads are.

A file is read whole and written whole (no reader sees part of one), and changed by
read-edit-write with no other writer's change in between: under a file lock on disk, by a
conditional PUT in the object store (If-Match the version read, If-None-Match for a new
one), read and edited again when another writer came first. Blocking I/O: activities call
it in a thread. Decides nothing about the contents.
"""

from __future__ import annotations

import fcntl
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perdure.activities.artifacts import ArtifactStore, artifact_store
from perdure.runtime import settings
from perdure.runtime.files import write_atomically
from perdure.runtime.s3_client import ObjectStoreUnavailable, S3Location, is_not_found, unavailable

DIRECTORY = "watchdog"
CHANGE_TRIES = 5
"""Conditional writes lost to another writer before a change gives up (two maintainers at once)."""
_LOST_RACE = ("PreconditionFailed", "ConditionalRequestConflict")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def file_name(scope: str, suffix: str) -> str:
    """A task queue as a file name: `<queue>.json`, `<queue>.rules.json`."""
    return (_UNSAFE.sub("_", scope).lstrip(".") or "default") + suffix


class WatchdogFile(ABC):
    @property
    @abstractmethod
    def where(self) -> str:
        """The file as messages name it: a path, or an s3:// URL."""

    @abstractmethod
    def read(self) -> bytes | None:
        """Its bytes, None when there is none; OSError (disk) or ObjectStoreUnavailable when it
        cannot be read."""

    @abstractmethod
    def write(self, data: bytes) -> None: ...

    @abstractmethod
    def change(self, edit: Callable[[bytes | None], bytes | None]) -> None:
        """Write `edit(what is there now)` (None: leave it), with no other change in between;
        `edit` may run more than once."""


class DiskFile(WatchdogFile):
    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def where(self) -> str:
        return str(self.path)

    def read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def write(self, data: bytes) -> None:
        write_atomically(self.path, data)

    def change(self, edit: Callable[[bytes | None], bytes | None]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            new = edit(self.read())
            if new is not None:
                self.write(new)


class ObjectFile(WatchdogFile):
    """One object in the artifact store's bucket, through its client."""

    def __init__(self, client: Any, store: S3Location, name: str) -> None:
        self._client, self._store = client, store
        self.key = store.under(DIRECTORY).key(name)

    @property
    def where(self) -> str:
        return f"s3://{self._store.bucket}/{self.key}"

    def read(self) -> bytes | None:
        return self._get()[0]

    def write(self, data: bytes) -> None:
        self._put(data)

    def change(self, edit: Callable[[bytes | None], bytes | None]) -> None:
        from botocore.exceptions import ClientError

        for _ in range(CHANGE_TRIES):
            data, etag = self._get()
            new = edit(data)
            if new is None:
                return
            try:
                self._put(new, {"IfMatch": etag} if etag else {"IfNoneMatch": "*"})
                return
            except ClientError as err:
                if err.response.get("Error", {}).get("Code") not in _LOST_RACE:
                    raise unavailable(err, self._store, "artifact store") from None
        raise ObjectStoreUnavailable(
            f"{self.where} changed under every one of {CHANGE_TRIES} tries to change it: try again"
        )

    def _get(self) -> tuple[bytes | None, str | None]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._client.get_object(Bucket=self._store.bucket, Key=self.key)
            return response["Body"].read(), response.get("ETag")
        except (BotoCoreError, ClientError) as err:
            if is_not_found(err):
                return None, None
            raise unavailable(err, self._store, "artifact store") from None

    def _put(self, data: bytes, condition: dict[str, str] | None = None) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.put_object(Bucket=self._store.bucket, Key=self.key, Body=data, **(condition or {}))
        except ClientError as err:
            if condition and err.response.get("Error", {}).get("Code") in _LOST_RACE:
                raise  # another writer came first: change() reads again
            raise unavailable(err, self._store, "artifact store") from None
        except BotoCoreError as err:
            raise unavailable(err, self._store, "artifact store") from None


@dataclass(frozen=True)
class WatchdogFiles:
    """The watchdog's files of one worker or command: beside `store` when it is an object
    store, else under `home`."""

    store: ArtifactStore | None
    home: Path

    def memory(self, scope: str) -> WatchdogFile:
        return self._file(file_name(scope, ".json"))

    def rules(self, scope: str) -> WatchdogFile:
        return self._file(file_name(scope, ".rules.json"))

    def _file(self, name: str) -> WatchdogFile:
        if self.store is not None and self.store.local_dir is None:
            # Imported here: boto3 costs a command that never reads the store ~0.3 s.
            from perdure.activities.artifacts.s3_store import S3ArtifactStore

            if isinstance(self.store, S3ArtifactStore):
                return ObjectFile(self.store.client, self.store.location, name)
        return DiskFile(self.home / DIRECTORY / name)


def watchdog_files() -> WatchdogFiles:
    """This command's: beside PERDURE_ARTIFACT_STORE's bucket, else under PERDURE_HOME."""
    return WatchdogFiles(artifact_store(), settings.perdure_home())
