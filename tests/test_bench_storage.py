"""`make bench` (bench/run.py) runs on the storage of the peers' headline row: the dev server
that `perdure server start` runs, its history in a SQLite db file on disk (bench/storage.py)."""

from __future__ import annotations

import json

import pytest

from bench import run as bench_run
from bench.storage import filesystem


@pytest.mark.slow
@pytest.mark.process
def test_make_bench_runs_on_a_db_file_on_disk_and_says_so(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results.json"
    monkeypatch.setattr(bench_run, "RESULTS", results)
    monkeypatch.setattr(bench_run.tempfile, "tempdir", str(tmp_path))
    assert bench_run.main(["--only", "replay"]) == 0
    out = capsys.readouterr().out
    where = f"dev server, db file on {filesystem(tmp_path)}"
    assert f"storage: {where}" in out
    figures = json.loads(results.read_text())
    assert figures["bench_storage"] == where
    assert figures["replay_s"] > 0


def test_a_bench_directory_in_memory_is_refused_with_what_is_wrong(capsys):
    assert bench_run.main(["--only", "replay", "--disk-dir", "/dev/shm"]) == 2
    assert "/dev/shm is on tmpfs" in capsys.readouterr().err
