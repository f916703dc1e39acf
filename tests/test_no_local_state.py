"""No hidden local state: what a worker or a command keeps is in Temporal, the artifact store
or the memory store, is a cache whose loss changes nothing, or belongs to a host by design
(docs/guide/deployment.md, "Where state lives"). Each test runs the hosts of a fleet as
PERDURE_HOMEs of their own beside one S3-compatible store (moto's real server), and looks
at what an operator would: a command's output, the bucket, the homes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from temporalio.testing import ActivityEnvironment
from typer.testing import CliRunner

from perdure.activities.artifacts.s3_store import S3ArtifactStore
from perdure.activities.watchdog.watchdog_files import WatchdogFiles
from perdure.activities.watchdog.watchdog_memory import change_rules, load_rules, parse_assignment
from perdure.activities.watchdog.watchdog_visibility import VisibilityActivities
from perdure.runtime.codec import KEY_FILE_ENV, KEYS_ENV, is_sealed
from perdure.runtime.s3_client import S3Location
from perdure.starters.cli import app
from perdure.testing.s3_server import S3Server
from perdure.workflows.watchdog.watchdog_contracts import RecallInput, RememberInput, RunSummary, WatchdogMemory
from tests.payload_keys import KEY_A


def perdure_cli(home: Path, queue: str, *args: str):
    """A `perdure` command on a host of its own (its own PERDURE_HOME), in this process."""
    env = {"PERDURE_HOME": str(home), "PERDURE_TASK_QUEUE": queue, "PERDURE_USER": "alice", "COLUMNS": "200"}
    return CliRunner().invoke(app, list(args), env=env)


def a_worker(env, home: Path, location: S3Location) -> VisibilityActivities:
    """The watchdog's activities of a worker on a host of its own."""
    return VisibilityActivities(env.client, home=home, store=S3ArtifactStore(location))


async def test_the_watchdog_s_rules_and_memory_are_the_same_on_every_host(
    env, s3_server: S3Server, s3_artifacts: S3Location, tmp_path, monkeypatch
):
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    monkeypatch.setenv(KEYS_ENV, KEY_A)
    queue = "fleet-queue"
    # A maintainer's laptop sets a rule; two workers on two other hosts judge and remember.
    said = perdure_cli(tmp_path / "laptop", queue, "watchdog", "set", "stall_after_s=60", "--for", "tag=nightly")
    assert said.exit_code == 0, said.output
    host_b, host_c = a_worker(env, tmp_path / "host-b", s3_artifacts), a_worker(env, tmp_path / "host-c", s3_artifacts)
    recalled = await ActivityEnvironment().run(host_b.recall, RecallInput(scope=queue))
    assert recalled.rules.scopes == {"tag=nightly": {"stall_after_s": 60.0}} and recalled.rules_note is None

    memory = WatchdogMemory(last_run=RunSummary(run_id="wd-1", at=datetime.now(UTC), goals=3))
    kept = await ActivityEnvironment().run(host_c.remember, RememberInput(scope=queue, memory=memory))
    assert kept.path == f"s3://{s3_artifacts.bucket}/perdure/artifacts/watchdog/{queue}.json"
    again = await ActivityEnvironment().run(host_b.recall, RecallInput(scope=queue))
    assert again.memory == memory and again.note is None

    # What a third host's commands show is the same book and memory.
    listed = perdure_cli(tmp_path / "desk", queue, "watchdog", "rules")
    assert listed.exit_code == 0 and "tag=nightly" in listed.output and "alice" in listed.output, listed.output
    reported = perdure_cli(tmp_path / "desk", queue, "watchdog", "report")
    assert reported.exit_code == 0 and f"perdure/artifacts/watchdog/{queue}.json" in reported.output, reported.output

    # In the bucket, sealed; on no host's disk.
    objects = s3_server.objects(s3_artifacts.bucket, "perdure/artifacts/watchdog/")
    assert sorted(objects) == [
        f"perdure/artifacts/watchdog/{queue}.json",
        f"perdure/artifacts/watchdog/{queue}.rules.json",
    ]
    assert all(is_sealed(blob) and b"nightly" not in blob for blob in objects.values())
    assert not list(tmp_path.glob("*/watchdog"))


def test_a_rule_change_that_loses_a_race_is_made_again_on_what_won(s3_artifacts: S3Location, tmp_path):
    files = WatchdogFiles(S3ArtifactStore(s3_artifacts, None), tmp_path)
    kept = files.rules("q")
    now = datetime.now(UTC)
    change_rules(kept, "all", [parse_assignment("stall_after_s=600")], "alice", now)
    edits = []
    write = kept.change

    def racing(edit):
        def edit_after_bob_s(raw):
            if not edits:
                # Another maintainer's change lands between this read and this write.
                change_rules(files.rules("q"), "tag=nightly", [parse_assignment("failing_attempts=5")], "bob", now)
            edits.append(raw)
            return edit(raw)

        write(edit_after_bob_s)

    kept.change = racing
    change_rules(kept, "all", [parse_assignment("escalate_after=2")], "carol", now)
    assert len(edits) == 2  # its conditional write was refused, so it read and edited again
    book, _ = load_rules(files.rules("q"))
    assert [(c.version, c.user, c.rule) for c in book.history] == [
        (1, "alice", "stall_after_s"),
        (2, "bob", "failing_attempts"),
        (3, "carol", "escalate_after"),
    ]
    assert book.scopes == {
        "all": {"stall_after_s": 600.0, "escalate_after": 2.0},
        "tag=nightly": {"failing_attempts": 5},
    }
