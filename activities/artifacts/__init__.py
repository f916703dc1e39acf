"""The artifact store: the contract (store.py), its backends on disk (disk_store.py)
and in an S3-compatible object store (s3_store.py), and `artifact_store()`, the one
place a worker, the CLI, `perdure ui`, the MCP server and the benchmarks get theirs
from: PERDURE_ARTIFACT_STORE (runtime/settings.py artifact_location) says which.
"""

from __future__ import annotations

from perdure.activities.artifacts.disk_store import DiskArtifactStore
from perdure.activities.artifacts.store_contract import (
    ArtifactCorrupt,
    ArtifactMissing,
    ArtifactStore,
    StoreCallOnLoop,
    preview,
)
from perdure.runtime import settings
from perdure.runtime.converter import check_payload_store
from perdure.runtime.s3_client import ObjectStoreUnavailable

__all__ = [
    "ArtifactCorrupt",
    "ArtifactMissing",
    "ArtifactStore",
    "DiskArtifactStore",
    "ObjectStoreUnavailable",
    "StoreCallOnLoop",
    "artifact_store",
    "checked_stores",
    "preview",
]


def checked_stores() -> ArtifactStore:
    """The artifact store PERDURE_ARTIFACT_STORE names, after reaching it and the payload
    store once (blocking), as a worker, `perdure ui` and `perdure mcp` do at their start: a
    setting, a bucket, credentials or an endpoint they cannot use is one line then
    (ArtifactStoreConfigError, PayloadStoreConfigError, ObjectStoreUnavailable), not a
    failure in the middle of a goal or a page."""
    store = artifact_store()
    store.check()
    check_payload_store()
    return store


def artifact_store() -> ArtifactStore:
    """The store PERDURE_ARTIFACT_STORE names, with the environment's payload keys. Reads the
    setting only (ArtifactStoreConfigError); reaching the store is `check()`'s."""
    location = settings.artifact_location()
    if isinstance(location, settings.S3Location):
        # Imported here: boto3 costs a CLI command that never reads an artifact ~0.3 s.
        from perdure.activities.artifacts.s3_store import S3ArtifactStore

        return S3ArtifactStore(location)
    return DiskArtifactStore(location)
