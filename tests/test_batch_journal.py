"""The batch journal (activities/tools/batch_journal.py): what a killed worker's batch answered
is served to the same call of the same batch of the same run, and to nothing else; files go
once their task is recorded or nobody wrote to them for an hour (never the run being opened);
a torn line is skipped; with payload keys every line is sealed."""

from __future__ import annotations

import os
import time

from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.tools import batch_journal
from perdure.activities.tools.batch_journal import BatchJournal
from perdure.runtime.codec import Keyring, PayloadKey
from perdure.workflows.shared.contracts import ToolBatchEntry, ToolInput, ToolResult, WorkspaceFence


def read(path: str) -> ToolInput:
    return ToolInput(goal_id="g", node_key="", tool="read_file", workspace="/ws", args={"path": path})


def answer(text: str) -> ToolBatchEntry:
    return ToolBatchEntry(call=f"tool read_file · {text}", result=ToolResult(tool="read_file", ok=True, preview=text))


def test_an_answer_is_served_to_the_same_call_at_the_same_place_of_the_same_batch_only(tmp_path):
    journal = BatchJournal(tmp_path)
    first = journal.open("run-1", 3, recorded_below=0)
    first.keep(0, read("a"), answer("a"))
    first.keep(1, read("b"), answer("b"))
    first.close()

    again = journal.open("run-1", 3, recorded_below=0)
    assert again.answer(0, read("a")) == answer("a")
    assert again.answer(1, read("b")) == answer("b")
    assert again.answer(2, read("c")) is None  # never answered: it runs
    assert again.answer(0, read("b")) is None  # another call at that place
    assert again.served == 2
    assert journal.open("run-1", 4, recorded_below=0).answer(0, read("a")) is None  # another batch
    assert journal.open("run-2", 3, recorded_below=0).answer(0, read("a")) is None  # another run


def test_a_torn_last_line_is_skipped_and_the_lines_before_it_stand(tmp_path):
    journal = BatchJournal(tmp_path)
    kept = journal.open("run-1", 0, recorded_below=0)
    kept.keep(0, read("a"), answer("a"))
    kept.close()
    with open(kept.path, "a", encoding="utf-8") as file:
        file.write('{"i": 1, "call": "')  # the worker died inside this line
    again = journal.open("run-1", 0, recorded_below=0)
    assert again.answer(0, read("a")) == answer("a")
    assert again.answer(1, read("b")) is None


def test_batches_below_recorded_below_go_and_the_others_stay(tmp_path):
    journal = BatchJournal(tmp_path)
    for batch in range(4):
        kept = journal.open("run-1", batch, recorded_below=0)
        kept.keep(0, read("a"), answer("a"))
        kept.close()
    journal.open("run-1", 4, recorded_below=2)
    assert sorted(p.name for p in (tmp_path / "run-1").iterdir()) == ["2.jsonl", "3.jsonl"]


def last_written_hours_ago(journal: BatchJournal, run: str, monkeypatch) -> None:
    """Run `run`'s directory and files last written two stale periods ago, and a sweep due."""
    hours_ago = time.time() - 2 * batch_journal.STALE_AFTER_S
    for path in (journal.root / run, *(journal.root / run).iterdir()):
        os.utime(path, (hours_ago, hours_ago))
    monkeypatch.setattr(journal, "_swept_at", 0.0)


def test_runs_nobody_wrote_to_for_an_hour_are_swept(tmp_path, monkeypatch):
    journal = BatchJournal(tmp_path)
    for run in ("old", "recent"):
        kept = journal.open(run, 0, recorded_below=0)
        kept.keep(0, read("a"), answer("a"))
        kept.close()
    last_written_hours_ago(journal, "old", monkeypatch)
    journal.open("recent", 1, recorded_below=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recent"]


def test_a_journal_that_cannot_be_written_only_loses_the_shortcut(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert BatchJournal(blocked).open("run-1", 0, recorded_below=0) is None


def test_a_run_quiet_for_an_hour_keeps_what_it_kept_when_its_next_batch_opens_it(tmp_path, monkeypatch):
    # A goal that waited an hour between two batches: the sweep that the opening makes due
    # must not take the very run it opens (before: it removed it, kept answers and all).
    journal = BatchJournal(tmp_path)
    kept = journal.open("run-1", 3, recorded_below=0)
    kept.keep(0, read("a"), answer("a"))
    kept.close()
    last_written_hours_ago(journal, "run-1", monkeypatch)
    again = journal.open("run-1", 3, recorded_below=0)
    assert again.answer(0, read("a")) == answer("a")
    again.keep(1, read("b"), answer("b"))
    again.close()
    assert journal.open("run-1", 3, recorded_below=0).answer(1, read("b")) == answer("b")


def test_with_payload_keys_no_line_holds_a_reads_content_in_plaintext(tmp_path):
    keys = Keyring([PayloadKey("k1", os.urandom(32))])
    store = DiskArtifactStore(tmp_path / "store", keyring=keys)
    journal = BatchJournal.beside(store)
    kept = journal.open("run-1", 0, recorded_below=0)
    kept.keep(0, read("a"), answer("SECRET-PLAN-7731"))
    kept.close()

    files = list(journal.root.rglob("*.jsonl"))
    assert files and all(b"SECRET-PLAN-7731" not in f.read_bytes() for f in files)
    assert BatchJournal.beside(store).open("run-1", 0, recorded_below=0).answer(0, read("a")) == answer(
        "SECRET-PLAN-7731"
    )
    # Another key (or none) opens nothing: the call runs again.
    other = BatchJournal(journal.root, Keyring([PayloadKey("k2", os.urandom(32))]))
    assert other.open("run-1", 0, recorded_below=0).answer(0, read("a")) is None
    assert BatchJournal(journal.root).open("run-1", 0, recorded_below=0).answer(0, read("a")) is None


def test_a_call_made_again_in_another_workflow_task_is_not_served(tmp_path):
    # A fenced call (an agent turn's, write_file) names the task that made it: a takeover's
    # task is another, so the journal serves only plan-step reads (module docstring).
    fenced = read("a").model_copy(update={"fence": WorkspaceFence(chain="c", node="n", run=1, task=40)})
    journal = BatchJournal(tmp_path)
    kept = journal.open("run-1", 0, recorded_below=0)
    kept.keep(0, fenced, answer("a"))
    kept.close()
    again = journal.open("run-1", 0, recorded_below=0)
    assert again.answer(0, fenced) == answer("a")
    assert again.answer(0, fenced.model_copy(update={"fence": fenced.fence.model_copy(update={"task": 52})})) is None
