"""The arithmetic, parsing and ledger behind `make bench-peers` (bench/peers_run.py), and the
harness itself run end to end at a tiny size (the peers in bench/peers/.venv, built if missing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from bench import fsyncs, peers_run
from bench.peers_report import RESTART, Row, figures, targets, write_targets
from bench.peers_run import (
    Crash,
    Ledger,
    Steps,
    parse_runs,
    per_step_ms,
    refusal,
    reruns,
    runs_per_step,
    spans,
    step_name,
    step_workspace,
)
from bench.peers_writes import Writes
from bench.storage import filesystem, server_argv, settings
from perdure.runtime.converter import STORE_ENV, THRESHOLD_ENV
from perdure.starters.devserver import dev_server_argv


def test_a_peers_run_lines_are_grouped_by_size_and_anything_else_is_refused_by_its_line():
    text = '{"n": 30, "seconds": 0.1}\n\n{"n": 300, "seconds": 1.0}\n{"n": 30, "seconds": 0.2}\n'
    assert parse_runs(text) == {30: [0.1, 0.2], 300: [1.0]}
    with pytest.raises(ValueError, match="Traceback"):
        parse_runs('{"n": 30, "seconds": 0.1}\nTraceback (most recent call last):\n')
    with pytest.raises(ValueError, match="seconds"):
        parse_runs('{"n": 30}\n')


def test_per_step_is_the_slope_between_the_medians_so_one_slow_repeat_does_not_count():
    # 0.5 s fixed + 2 ms a step; the third small run was disturbed.
    runs = {30: [0.56, 0.56, 9.0], 300: [1.1, 1.1, 1.1]}
    assert per_step_ms(runs, 30, 300) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no run of 300 steps"):
        per_step_ms({30: [0.5]}, 30, 300)


def test_closes_per_step_come_from_an_uninterrupted_run_and_must_divide_evenly():
    # A perdure read step opens its file twice (the read, then its fingerprint).
    assert runs_per_step(Counter({0: 6, 1: 6, 2: 6}), 9) == 2
    assert runs_per_step(Counter({0: 3, 1: 3, 2: 3}), 9) == 1
    with pytest.raises(ValueError, match="7 closes"):
        runs_per_step(Counter({0: 4, 1: 3}), 4)
    with pytest.raises(ValueError):
        runs_per_step(Counter(), 3)


def test_reruns_count_whole_runs_of_each_step_and_every_read_of_the_gate():
    # Two closes a run: steps 0 and 1 ran twice, step 3 once; the gate (2) was read by
    # the killed process and again (a FIFO is not fingerprinted: one close a read).
    closes = Counter({0: 4, 1: 4, 2: 2, 3: 2})
    assert reruns(closes, per_step=2, gate=2) == [0, 1, 2]
    # A peer: one close a run, only the gate again.
    assert reruns(Counter({0: 1, 1: 1, 2: 2, 3: 1}), per_step=1, gate=2) == [2]
    assert reruns(Counter(), per_step=1, gate=2) == []


def test_rerun_steps_are_shown_as_runs_of_consecutive_steps():
    assert spans(list(range(42))) == "0-41"
    assert spans([0, 1, 2, 39, 40, 41]) == "0-2, 39-41"
    assert spans([0, 1, 2, 5, 5, 7]) == "0-2, 5 (2 times), 7"
    assert spans([]) == ""


def crashed(resume_s: float | None, done_s: float | None, rerun: list[int]) -> Crash:
    return Crash(resume_s, done_s, rerun, ran=100, how="test")


def test_figures_give_perdures_ratio_to_each_peer_and_leave_out_what_was_not_measured():
    rows = {
        "perdure": Row("perdure", steps=Steps(ms=3.0, per_step=2), crash=crashed(4.0, 5.0, [0, 1, 39])),
        RESTART: Row("perdure, restarted worker", crash=crashed(8.0, 9.0, [0, 39])),
        "raw": Row("raw", raw_ms=6.0),
        "langgraph": Row("lg", steps=Steps(ms=1.5, per_step=1), crash=crashed(2.0, 3.0, [39])),
        "dbos": Row("dbos", steps=Steps(ms=2.0, per_step=1), crash=crashed(None, None, [39])),
    }
    out = figures(rows)
    assert out["perdure_read_step_ms"] == 3.0 and out["raw_local_activity_ms"] == 6.0
    assert out["perdure_step_ratio_to_langgraph"] == 2.0 and out["perdure_step_ratio_to_dbos"] == 1.5
    assert out["perdure_recovery_ratio_to_langgraph"] == 2.0
    assert out["perdure_restart_recovery_s"] == 8.0 and out["perdure_restart_recovery_ratio_to_langgraph"] == 4.0
    assert out["perdure_rerun_steps"] == 3 and out["peer_dbos_rerun_steps"] == 1
    # DBOS never resumed in this made-up run: no recovery figure, no ratio to it.
    assert "peer_dbos_recovery_s" not in out and not any(
        key.endswith("ratio_to_dbos") and "recovery" in key for key in out
    )
    rows["langgraph"] = Row("lg")
    assert not any("langgraph" in key for key in figures(rows))


def test_the_ledger_counts_each_read_of_a_step_file_even_back_to_back_and_not_the_harness_writes(tmp_path):
    workspace = step_workspace(tmp_path / "ws", 3, blocking=2)
    assert os.path.isfile(workspace / step_name(0)) and not os.path.isfile(workspace / step_name(2))
    with Ledger(workspace) as ledger:
        # A perdure read step reads its file twice in a row: identical close events
        # queued back to back would be merged into one by the kernel.
        for index in [0] * 200 + [1]:
            (workspace / step_name(index)).read_bytes()
        (workspace / step_name(1)).write_bytes(b"y\n")
        (workspace / "notes.txt").write_text("not a step")
        (workspace / "notes.txt").read_text()
        deadline = time.monotonic() + 5
        while sum(ledger.closes().values()) < 201 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)
        assert ledger.closes() == Counter({0: 200, 1: 1})


@pytest.mark.process
def test_a_step_killed_inside_its_read_is_on_the_ledger(tmp_path):
    """The crash test counts the killed process's read of the gate: the kernel closes its file."""
    workspace = step_workspace(tmp_path / "ws", 1, blocking=0)
    gate = workspace / step_name(0)
    with Ledger(workspace) as ledger:
        reader = subprocess.Popen([sys.executable, "-c", f"open({str(gate)!r}, 'rb').read()"])
        deadline = time.monotonic() + 10
        held = None
        while held is None and time.monotonic() < deadline:
            try:
                held = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.01)
        assert held is not None, "the reader never opened the gate"
        reader.kill()
        reader.wait(timeout=10)
        os.close(held)
        while not ledger.closes() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ledger.closes() == Counter({0: 1})


def test_options_that_cannot_run_are_refused_with_what_is_wrong(tmp_path, monkeypatch):
    good = dict(n=300, small=30, repeats=3, crash_n=100, block_at=39, wait_s=120.0, writes=30)
    storages = settings(str(tmp_path), "/dev/shm")
    monkeypatch.setattr(peers_run, "PEER_PYTHON", tmp_path / "python")
    (tmp_path / "python").touch()
    assert refusal(good, storages) is None
    assert "--small (300)" in refusal({**good, "small": 300}, storages)
    assert "--block-at (100)" in refusal({**good, "block_at": 100}, storages)
    assert "--repeats" in refusal({**good, "repeats": 0}, storages)
    assert "--writes" in refusal({**good, "writes": 1}, storages) and refusal({**good, "writes": 0}, storages) is None
    assert "is not a directory" in refusal(good, settings(str(tmp_path / "python"), "/dev/shm"))
    # A db-file row whose files would all be in memory, an in-memory row written to disk: unequal storage.
    assert "--disk-dir: /dev/shm is on tmpfs" in refusal(good, settings("/dev/shm", "/dev/shm"))
    assert "--memory-dir" in refusal(good, settings(str(tmp_path), str(tmp_path)))
    monkeypatch.setattr(peers_run, "PEER_PYTHON", peers_run.ROOT / "bench" / "peers" / "no-venv" / "python")
    assert "make bench-peers" in refusal(good, storages)


def test_fsyncs_are_read_from_straces_summary_whatever_its_columns():
    summary = (
        "% time     seconds  usecs/call     calls    errors syscall\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        " 90.00    0.000900          64        14           fdatasync\n"
        " 10.00    0.000100          50         2         1 fsync\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        "100.00    0.001000          62        16         1 total\n"
    )
    assert fsyncs.calls(summary) == 16
    assert fsyncs.calls("") == 0
    # Per step is the slope, as the timings: a run's fixed count cancels out.
    assert fsyncs.per_step({30: 70, 300: 610}) == 2.0


def test_the_db_file_server_runs_perdure_server_starts_command_and_the_memory_one_only_drops_its_db_file(tmp_path):
    on_file, in_memory = server_argv(7300, 8300, tmp_path, True), server_argv(7300, 8300, tmp_path, False)
    assert on_file == dev_server_argv(7300, 8300, tmp_path)
    at = on_file.index("--db-filename")
    assert on_file[at + 1] == str(tmp_path / "temporal.db")
    assert in_memory == on_file[:at] + on_file[at + 2 :] and "--db-filename" not in in_memory


def test_a_server_that_does_not_start_is_reported_on_its_row_without_a_traceback(tmp_path, monkeypatch, capsys):
    async def refused(data, on_file):
        raise RuntimeError(f"the dev server did not start (no answer): {'db file' if on_file else 'memory'}")

    # peers_run points this process's PERDURE_HOME and payload store at its scratch directory
    # (bench/common.py use_home): noted here so they are put back, or later tests in this
    # process would read their payloads from a directory gone with the run.
    for name in ("PERDURE_HOME", STORE_ENV, THRESHOLD_ENV, "PERDURE_WATCHDOG_INTERVAL_S"):
        was = os.environ.get(name)
        monkeypatch.setenv(name, "")  # recorded as it was (set or not), put back after the test
        if was is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, was)
    monkeypatch.setattr(peers_run, "PEER_PYTHON", tmp_path / "python")
    (tmp_path / "python").touch()
    monkeypatch.setattr(peers_run, "start_server", refused)
    results = tmp_path / "out.json"
    assert peers_run.main(["--n", "4", "--small", "2", "--repeats", "1", "--results", str(results)]) == 1
    out = capsys.readouterr().out
    assert "not measured: db file: perdure goal, read steps: the dev server did not start" in out
    assert "not measured: memory: perdure goal, read steps" in out
    figures = json.loads(results.read_text())
    assert figures["perdure_storage"].startswith("dev server, db file on") and "perdure_read_step_ms" not in figures


def test_the_filesystem_of_a_path_is_the_one_of_its_deepest_mount():
    assert filesystem(Path("/dev/shm/anything/below")) == "tmpfs"
    assert filesystem(Path("/proc/self")) == "proc"


def test_each_storage_figure_ends_in_its_suffix_and_names_its_storage():
    rows = {
        "perdure": Row(
            "perdure", "dev server, in memory", steps=Steps(3.0, 1, {"server": 0.0, "worker": 0.5}, {"server": 0.0})
        ),
        RESTART: Row("perdure, restarted worker", "dev server, in memory"),
        "raw": Row("raw", "dev server, in memory", raw_ms=6.0),
        "langgraph": Row("lg", "SQLite file on tmpfs", steps=Steps(1.5, 1, {"peer": 4.0})),
        "dbos": Row("dbos", "SQLite file on tmpfs"),
    }
    out = figures(rows, "_memory")
    assert all(key.endswith("_memory") for key in out)
    assert out["perdure_step_ratio_to_langgraph_memory"] == 2.0
    assert out["perdure_storage_memory"] == "dev server, in memory"
    assert out["peer_dbos_storage_memory"] == "SQLite file on tmpfs" and "peer_dbos_step_ms_memory" not in out
    assert out["perdure_fsyncs_per_step_memory"] == 0.5 and out["perdure_server_fsyncs_per_step_memory"] == 0.0
    assert out["perdure_server_fsyncs_per_run_memory"] == 0.0
    assert out["peer_langgraph_fsyncs_per_step_memory"] == 4.0 and "peer_dbos_fsyncs_per_step_memory" not in out


def test_targets_need_perdure_under_its_bound_and_under_the_peer_on_each_storage():
    def rows(step_ms: float, lg_ms: float, resume: float | None, dbos_resume: float) -> dict[str, Row]:
        return {
            "perdure": Row("perdure", steps=Steps(ms=step_ms, per_step=2), crash=crashed(resume, 9.0, [39])),
            "langgraph": Row("lg", steps=Steps(ms=lg_ms, per_step=1)),
            "dbos": Row("dbos", crash=crashed(dbos_resume, 9.0, [39])),
        }

    on_file, in_memory = settings("/tmp", "/dev/shm")
    step, recovery, *_writes = targets({on_file: rows(0.9, 1.2, 2.0, 3.4)})
    assert "met (0.90 against 1.20 ms)" in step and "met (2.00 against 3.40 s)" in recovery
    assert step.startswith("target (db file)")
    # Under the bound but not under the peer, and the other way round; each storage judged on its own.
    judged = targets({on_file: rows(0.9, 1.2, 2.0, 3.4), in_memory: rows(0.9, 0.8, 3.0, 3.4)})
    assert [line.split(":")[0] for line in judged] == ["target (db file)"] * 4 + ["target (memory)"] * 4
    assert "met" in judged[0] and "MISSED" in judged[4] and "MISSED" in judged[5]
    assert "not measured" in targets({on_file: rows(0.9, 1.2, None, 3.4)})[1]
    # A slope below 0 (too few steps on a busy machine) is noise, never a target met.
    assert "not judged" in targets({on_file: rows(-0.5, 1.2, 2.0, 3.4)})[0]


def test_write_targets_compare_a_keyed_write_with_the_peers_write_step_and_a_once_write_with_a_raw_activity():
    on_file, _ = settings("/tmp", "/dev/shm")
    reads = Steps(ms=0.5, per_step=1)  # the peer's read step: not what a write is judged against

    def judged(keyed_ms: float, once_ms: float) -> list[str]:
        writes = Writes(keyed_ms=keyed_ms, raw_local_keyed_ms=5.0, once_ms=once_ms, raw_once_ms=20.0)
        rows = {"perdure": Row("perdure", writes=writes), "langgraph": Row("lg", steps=reads, write_ms=2.0)}
        return write_targets(on_file, rows)

    keyed, once = judged(3.9, 21.0)
    assert "keyed write step ≤ 2× LangGraph" in keyed and "step making the same call" in keyed
    assert "met (3.90 against 2.00 ms)" in keyed
    assert "met (21.00 against 20.00 ms)" in once
    keyed, once = judged(4.1, 21.2)
    assert "MISSED" in keyed and "MISSED" in once
    perdure_only = Row("perdure", writes=Writes(3.9, 5.0, 21.0, 20.0))
    no_peer_write = {"perdure": perdure_only, "langgraph": Row("lg", steps=reads)}
    assert "not measured" in write_targets(on_file, no_peer_write)[0]
    assert "not measured" in write_targets(on_file, {"perdure": Row("perdure"), "langgraph": Row("lg")})[0]
    out = figures(
        {
            "perdure": Row("perdure", writes=Writes(6.0, 5.0, 21.0, 20.0)),
            "raw": Row("raw"),
            RESTART: Row("restart"),
            "langgraph": Row("lg", steps=Steps(ms=2.0, per_step=1), write_ms=4.0),
            "dbos": Row("dbos"),
        }
    )
    assert out["perdure_write_step_ms"] == 6.0 and out["langgraph_write_step_ms"] == 4.0
    assert out["perdure_write_step_ratio_to_langgraph"] == 1.5
    assert out["perdure_once_write_step_ms"] == 21.0 and out["perdure_once_write_ratio_to_raw"] == 1.05


@pytest.fixture(scope="module")
def peers_venv():
    """bench/peers/.venv, built as `make bench-peers` builds it (pip, from the pinned requirements)."""
    built = subprocess.run(
        ["make", "-C", str(peers_run.ROOT), "bench/peers/.venv/.installed"], capture_output=True, text=True, timeout=900
    )
    assert built.returncode == 0, f"building the peers' venv failed:\n{built.stdout[-2000:]}{built.stderr[-2000:]}"
    return peers_run.PEER_PYTHON


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.timeout(900)
def test_make_bench_peers_runs_every_system_on_a_db_file_and_again_in_memory_and_counts_their_fsyncs(
    tmp_path, peers_venv
):
    """The harness end to end at a tiny size, as `make bench-peers` runs it, so it cannot rot:
    both storage rows, each system's storage named, fsyncs counted by strace."""
    results = tmp_path / "peers_results.json"
    ran = subprocess.run(
        [sys.executable, "-m", "bench.peers_run", "--n", "8", "--small", "3", "--repeats", "1"]
        + ["--crash-n", "6", "--block-at", "2", "--wait-s", "60", "--writes", "3", "--results", str(results)],
        cwd=peers_run.ROOT,
        capture_output=True,
        text=True,
        timeout=800,
    )
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out[-4000:]
    assert "Traceback" not in out
    figures = json.loads(results.read_text())
    for suffix in ("", "_memory"):
        for key in (
            *("perdure_step_ratio_to_langgraph", "perdure_step_ratio_to_dbos", "perdure_rerun_steps"),
            *("perdure_write_step_ratio_to_langgraph", "perdure_once_write_ratio_to_raw", "langgraph_write_step_ms"),
        ):
            assert key + suffix in figures, (key + suffix, sorted(figures))
        for key in ("perdure_fsyncs_per_step", "peer_langgraph_fsyncs_per_step", "peer_dbos_fsyncs_per_step"):
            assert isinstance(figures[key + suffix], int | float)
    # The headline row: the server writes a db file, the peers their SQLite files, all on one disk.
    disk = Path(tempfile.gettempdir())
    assert "db file" in figures["perdure_storage"] and "in memory" in figures["perdure_storage_memory"]
    fs = filesystem(disk)
    assert figures["peer_langgraph_storage"] == f"SQLite file on {fs}" != figures["peer_langgraph_storage_memory"]
    # perdure's read steps are recorded a workflow task at a time: per step its server's fsyncs are
    # near 0 (the slope), per goal run they are not.
    assert figures["perdure_server_fsyncs_per_run"] > 0
    assert figures["peer_langgraph_fsyncs_per_step"] > 0 and figures["peer_dbos_fsyncs_per_step"] > 0
    # In memory the server makes no fsync at all.
    assert figures["perdure_server_fsyncs_per_run_memory"] == 0
    # The printed tables say which storage each figure is on.
    assert "on a db file" in out and "in memory" in out and "fsyncs per step" in out
