"""What one artifact put and one get cost, on disk and in an S3-compatible object store
(`artifact_put_ms_disk`, `artifact_get_ms_disk`, `artifact_put_ms_s3`, `artifact_get_ms_s3`).

BLOBS distinct blobs of SIZE bytes (a tool's output, roughly) are put through each store,
one after another, then read back (the digest check included), without payload keys:
the median of each. The disk store fsyncs every file it writes; the object store is
moto's S3 server on this machine (perdure.testing.s3_server), reached over HTTP on
localhost by the boto3 client a worker uses: its figures are the client's and the
protocol's cost, not a real network store's, whose round trip adds its own latency.
A put of bytes already kept (what every retried activity does) is printed too.

    .venv/bin/python -m bench.artifact_store [--blobs 200 --size 4096]
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from temporalio.client import Client

from bench.common import Section, median, parse_options, run_standalone
from perdure.activities.artifacts import ArtifactStore, DiskArtifactStore
from perdure.activities.artifacts.s3_store import S3ArtifactStore
from perdure.runtime.s3_client import S3Location
from perdure.testing.s3_server import S3Server

KEYS = ("artifact_put_ms_disk", "artifact_get_ms_disk", "artifact_put_ms_s3", "artifact_get_ms_s3")


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def _measure_store(store: ArtifactStore, blobs: list[bytes]) -> tuple[list[float], list[float], list[float]]:
    """Milliseconds of each put, each get, and each put again of what is there."""
    refs: list = []
    puts = [_timed(lambda blob=blob: refs.append(store.put_bytes(blob))) for blob in blobs]
    gets = [_timed(lambda ref=ref: store.get_bytes(ref)) for ref in refs]
    again = [_timed(lambda blob=blob: store.put_bytes(blob)) for blob in blobs]
    return puts, gets, again


def _blobs(count: int, size: int) -> list[bytes]:
    return [i.to_bytes(4, "big") + os.urandom(size - 4) for i in range(count)]


def _measured(name: str, store: ArtifactStore, blobs: int, size: int, section: Section) -> None:
    puts, gets, again = _measure_store(store, _blobs(blobs, size))
    section.figures[f"artifact_put_ms_{name}"] = round(median(puts), 3)
    section.figures[f"artifact_get_ms_{name}"] = round(median(gets), 3)
    section.extra[f"artifact_put_again_ms_{name}"] = round(median(again), 3)
    section.notes.append(
        f"{name} ({store.where}): {blobs} blobs of {size} bytes, medians: put {median(puts):.3f} ms "
        f"(max {max(puts):.1f}), get {median(gets):.3f} ms (max {max(gets):.1f}), "
        f"put of a blob already kept {median(again):.3f} ms"
    )


async def measure(client: Client, workdir: Path, blobs: int = 200, size: int = 4096) -> Section:
    del client  # no Temporal server involved: the store is the worker's own business
    section = Section(figures={}, notes=[])
    _measured("disk", DiskArtifactStore(workdir / "artifact-bench", keyring=None), blobs, size, section)
    try:
        server = S3Server(workdir / "moto.log").start()
    except (OSError, RuntimeError) as err:  # moto[server] comes with the dev extras
        section.notes.append(f"s3: not measured: moto's S3 server did not start ({err})")
        return section
    saved = {name: os.environ.get(name) for name in server.env()}
    try:
        os.environ.update(server.env())
        s3 = S3ArtifactStore(S3Location(server.bucket("bench"), "artifacts"), keyring=None)
        s3.put_bytes(b"warm-up")  # the client's first call loads its service model and connects
        _measured("s3", s3, blobs, size, section)
        section.notes.append(
            "the s3 figures are against moto's S3 server on localhost (HTTP over loopback, in-memory), "
            "not a real network store: add a real store's round trip to each"
        )
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return section


def main(argv: list[str] | None = None) -> dict:
    return run_standalone(measure, parse_options(__doc__, argv, blobs=200, size=4096))


if __name__ == "__main__":
    main()
