"""The artifact store on a local (or mounted) directory: one file per blob, at
`<root>/sha256/<first two hex digits>/<digest>`, written atomically (temp file, fsync,
rename). The contract (addressing, encryption, digest checks) is store.py's.
"""

from __future__ import annotations

from pathlib import Path

from perdure.activities.artifacts.store_contract import _KEYS_FROM_ENV, ArtifactStore
from perdure.runtime.codec import Keyring
from perdure.runtime.files import write_atomically


class DiskArtifactStore(ArtifactStore):
    def __init__(self, root: Path, keyring: Keyring | None = _KEYS_FROM_ENV) -> None:
        super().__init__(keyring)
        self.root = root

    @property
    def where(self) -> str:
        return str(self.root)

    @property
    def local_dir(self) -> Path:
        return self.root

    def check(self) -> None:
        """Nothing to reach: a directory that cannot be written fails its first put, as it always did."""

    def _path(self, digest: str) -> Path:
        algo, _, hexdigest = digest.partition(":")
        return self.root / algo / hexdigest[:2] / hexdigest

    def _read(self, digest: str) -> bytes | None:
        try:
            return self._path(digest).read_bytes()
        except FileNotFoundError:
            return None

    def _read_head(self, digest: str, size: int) -> bytes | None:
        try:
            with self._path(digest).open("rb") as f:
                return f.read(size)
        except FileNotFoundError:
            return None

    def _write(self, digest: str, blob: bytes) -> None:
        write_atomically(self._path(digest), blob)

    def _exists(self, digest: str) -> bool:
        return self._path(digest).exists()

    def _location(self, digest: str) -> str:
        return str(self._path(digest))
