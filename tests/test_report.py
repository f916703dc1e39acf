"""The goal report: content, determinism, and survival of a lost artifact."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from perdure.activities.artifacts import ArtifactStore, DiskArtifactStore
from perdure.activities.goal.report import EXCERPT_CHARS, OUTPUT_CAP_CHARS, ReportActivities
from perdure.workflows.goal.contracts.goal_contracts import ReportInput, ReportResult, StepOutcome


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return DiskArtifactStore(tmp_path / "artifacts")


async def write(store: ArtifactStore, report_input: ReportInput) -> tuple[ReportResult, str]:
    result = await ActivityEnvironment().run(ReportActivities(store).write_report, report_input)
    return result, store.get_text(result.report)


def partial_goal(store: ArtifactStore) -> ReportInput:
    return ReportInput(
        goal_id="goal-42",
        goal="Summarise the docs\nand list open questions",
        outcome="partial",
        failure="step 'check' failed: command exited with 1",
        tokens=1234,
        cost_usd=0.0192,
        steps=[
            StepOutcome(
                name="read", kind="tool", status="succeeded", output=store.put_text("# Docs\nalpha | beta"), tokens=0
            ),
            StepOutcome(
                name="summary",
                kind="llm",
                status="succeeded",
                output=store.put_text("Three findings.\n```py\nprint(1)\n```"),
                tokens=1234,
                cost_usd=0.0192,
            ),
            StepOutcome(name="check", kind="tool", status="failed", error="command exited with 1; output:\nFAIL x"),
            StepOutcome(name="publish", kind="agent", status="abandoned"),
        ],
    )


async def test_report_has_goal_totals_steps_outputs_and_failure(store: ArtifactStore) -> None:
    result, text = await write(store, partial_goal(store))
    assert result.report.media_type == "text/markdown"
    assert text.startswith("# Goal report: goal-42\n\n## Goal\n\n> Summarise the docs\n> and list open questions\n")
    assert "**Outcome:** partial" in text
    assert "**Failure:** step 'check' failed: command exited with 1" in text
    assert "**Totals:** 1234 tokens, $0.0192" in text
    assert (
        "| step | kind | status | tokens | cost (USD) |\n"
        "|---|---|---|---:|---:|\n"
        "| read | tool | succeeded | 0 | 0.0000 |\n"
        "| summary | llm | succeeded | 1234 | 0.0192 |\n"
        "| check | tool | failed | 0 | 0.0000 |\n"
        "| publish | agent | abandoned | 0 | 0.0000 |\n"
    ) in text
    assert "### read\n\n```\n# Docs\nalpha | beta\n```" in text
    # Output containing a fence gets a longer fence, so it cannot end the block early.
    assert "### summary\n\n````\nThree findings.\n```py\nprint(1)\n```\n````" in text
    assert "## Errors\n\n### check (failed)\n\n```\ncommand exited with 1; output:\nFAIL x\n```" in text
    assert "### publish" not in text


async def test_same_input_same_digest(store: ArtifactStore) -> None:
    first, _ = await write(store, partial_goal(store))
    second, _ = await write(store, partial_goal(store))
    assert first.report.digest == second.report.digest
    changed = partial_goal(store).model_copy(update={"outcome": "failed"})
    third, _ = await write(store, changed)
    assert third.report.digest != first.report.digest


async def test_missing_artifact_is_reported_not_fatal(store: ArtifactStore, tmp_path: Path) -> None:
    lost = DiskArtifactStore(tmp_path / "elsewhere").put_text("never copied here")
    report_input = ReportInput(
        goal_id="g",
        goal="g",
        outcome="succeeded",
        steps=[
            StepOutcome(name="gone", kind="llm", status="succeeded", output=lost),
            StepOutcome(name="empty", kind="tool", status="succeeded"),
        ],
    )
    _, text = await write(store, report_input)
    assert f"### gone\n\n_Output artifact `{lost.digest}` is missing from the artifact store._" in text
    assert "### empty\n\n_No output was recorded._" in text
    assert "**Failure:**" not in text


async def test_long_output_is_capped_with_a_note(store: ArtifactStore) -> None:
    long_output = store.put_text("y" * (OUTPUT_CAP_CHARS + 500))
    report_input = ReportInput(
        goal_id="g",
        goal="g",
        outcome="succeeded",
        steps=[StepOutcome(name="big", kind="llm", status="succeeded", output=long_output)],
    )
    _, text = await write(store, report_input)
    assert "y" * OUTPUT_CAP_CHARS + "\n```" in text
    assert "y" * (OUTPUT_CAP_CHARS + 1) not in text
    assert (
        f"_Truncated: showing {OUTPUT_CAP_CHARS} of {OUTPUT_CAP_CHARS + 500} characters; "
        f"full output in artifact `{long_output.digest}`._"
    ) in text


async def test_excerpt_is_the_start_of_the_report(store: ArtifactStore) -> None:
    steps = [
        StepOutcome(name=f"s{i}", kind="llm", status="succeeded", output=store.put_text(f"output {i}\n" * 40))
        for i in range(5)
    ]
    result, text = await write(store, ReportInput(goal_id="g", goal="g", outcome="succeeded", steps=steps))
    assert len(text) > EXCERPT_CHARS
    assert result.excerpt.endswith("\n…")
    body = result.excerpt.removesuffix("\n…")
    assert text.startswith(body)
    assert EXCERPT_CHARS // 2 < len(result.excerpt) <= EXCERPT_CHARS + 2

    short, short_text = await write(store, ReportInput(goal_id="g", goal="g", outcome="failed", failure="no plan"))
    assert short.excerpt == short_text
    assert "No steps ran." in short_text


async def test_a_step_whose_output_was_reused_says_so_in_the_step_table(store: ArtifactStore) -> None:
    report_input = partial_goal(store)
    report_input.steps[0].reused = True  # e.g. a fork's step before its fork node
    _, text = await write(store, report_input)
    assert "| read | tool | succeeded (reused) | 0 |" in text
    assert "| summary | llm | succeeded | 1234 |" in text
