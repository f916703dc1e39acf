"""The goal report: one markdown artifact summing up what a goal did.

Owns rendering `ReportInput` into markdown (outcome, totals, a table of steps and
one of the work earlier plan versions left behind, each succeeded step's output
and each failed step's error, the latest decisions of its decision log) and storing
it. The text depends only on the input and the stored artifacts, never on the clock
or the machine, so rendering the same input twice yields the same digest and a
retried activity stores nothing new. It must not decide the outcome; the workflow does.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter

from pydantic import ValidationError
from temporalio import activity

from perdure.activities.artifacts import ArtifactCorrupt, ArtifactMissing, ArtifactStore
from perdure.activities.faults import fault_point
from perdure.activities.heartbeat import Heartbeat
from perdure.workflows.goal.contracts.goal_contracts import Activities, ReportInput, ReportResult, StepOutcome
from perdure.workflows.goal.contracts.past_chunks import PastChunk, step_outcome
from perdure.workflows.goal.rules.own_calls import own_call_lines, tool_spend

OUTPUT_CAP_CHARS = 4_000
"""Characters of each step's output quoted in the report; the full output stays in the store."""

EXCERPT_CHARS = 1_500
# A goal of more steps than this lists those that did not succeed and the last that did (a
# table of 100,000 rows is no report); the outputs quoted are those of the steps listed.
STEPS_LISTED = 1_000
LATEST_LISTED = 100


def render_report(store: ArtifactStore, input: ReportInput) -> str:
    lines = [
        f"# Goal report: {input.goal_id}",
        "",
        "## Goal",
        "",
        *_quote(input.goal),
        "",
        f"**Outcome:** {input.outcome}",
    ]
    if input.failure:
        lines += ["", f"**Failure:** {_one_line(input.failure)}"]
    lines += [
        "",
        f"**Totals:** {input.tokens} tokens, ${input.cost_usd:.4f}{tool_spend(input.tool_cost_usd)}",
        "",
        "## Steps",
        "",
    ]
    current = [s for s in input.steps if s.plan_version is None]
    unread = sum(input.past_counts.values())  # stored steps not read back (with_past_steps)
    listed = _listed(current, len(current) + unread)
    if len(listed) < len(current) + unread:
        counts = Counter(s.status for s in current) + Counter(input.past_counts)
        said = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        lines += [
            f"{len(current) + unread} steps: {said}. Listed: the steps that did not succeed among those the "
            f"goal still held and the latest it stored (up to {STEPS_LISTED}; the unfinished work below names "
            f"the first stored earlier and counts the rest), and the last {LATEST_LISTED} that succeeded. The "
            "goal's result holds every step: each stored one in a chunk of its `past`.",
            "",
        ]
    if current:
        lines += [
            "| step | kind | status | tokens | cost (USD) |",
            "|---|---|---|---:|---:|",
            *(f"| {_cell(s.name)} | {s.kind} | {_status(s)} | {s.tokens} | {s.cost_usd:.4f} |" for s in listed),
        ]
    else:
        lines.append("No steps ran.")
    # The totals count every model call; what no step was charged for (planning, repairs,
    # drift checks, stall judgements) gets its own line, so the rows add up to the totals.
    outside_tokens = input.tokens - sum(s.tokens for s in input.steps) - input.past_tokens
    outside_cost = input.cost_usd - sum(s.cost_usd for s in input.steps) - input.past_cost_usd
    if outside_tokens > 0 or outside_cost > 5e-5:
        outside = f"{max(outside_tokens, 0)} | {max(outside_cost, 0):.4f}"
        if current:
            lines.append(f"| (planning, drift and other calls outside steps) | — | — | {outside} |")
        else:
            lines.append(f"Planning, drift and other calls outside steps: {outside.replace(' | ', ' tokens, $')}.")
    if input.own_calls:
        lines += ["", "## perdure's own model calls", "", *(f"- {line}" for line in own_call_lines(input.own_calls))]
    earlier = [s for s in input.steps if s.plan_version is not None]
    if earlier:
        lines += [
            "",
            "## Work from earlier plan versions",
            "",
            "Steps a later plan version left out, after they had run, failed or been given up.",
            "",
            "| step | plan | kind | status | tokens | cost (USD) |",
            "|---|---|---|---|---:|---:|",
            *(
                f"| {_cell(s.name)} | v{s.plan_version} | {s.kind} | {s.status} | {s.tokens} | {s.cost_usd:.4f} |"
                for s in earlier
            ),
        ]

    succeeded = [s for s in input.steps if s.status == "succeeded"]
    if len(current) + unread > STEPS_LISTED:
        succeeded = succeeded[-LATEST_LISTED:]  # those the table lists
    if succeeded:
        lines += ["", "## Outputs"]
        for step in succeeded:
            lines += ["", f"### {_heading(step)}", "", *_output_section(store, step)]

    errored = [s for s in input.steps if s.status != "succeeded" and s.error]
    if errored:
        lines += ["", "## Errors"]
        for step in errored:
            lines += ["", f"### {_heading(step)} ({step.status})", "", *_fenced(step.error or "")]

    waits = [s for s in input.steps if s.kind == "wait" and s.status == "succeeded" and s.plan_version is None]
    if waits:
        # When each wait step acted and how late, as its output says it: never claimed punctual.
        lines += ["", "## Timers", "", *(f"- {_one_line(_first_line(store, s))}" for s in waits)]

    if input.unfinished:
        lines += ["", "## Unfinished work", "", *(f"- {_one_line(item)}" for item in input.unfinished)]
    if input.notes:
        lines += ["", "## What changed along the way", "", *(f"- {_one_line(note)}" for note in input.notes)]
    if input.decisions:
        shown = len(input.decisions)
        which = f"The last {shown} of {input.decision_count}" if shown < input.decision_count else f"All {shown}"
        lines += [
            "",
            "## Decisions",
            "",
            f"{which} decisions that shaped the work (all of them: `perdure log {input.goal_id}`).",
            "",
            *(f"- {d.seq} · {d.kind} · {_one_line(d.who)} · {_one_line(d.text)}" for d in input.decisions),
        ]

    return "\n".join(lines) + "\n"


def _listed(steps: list[StepOutcome], total: int) -> list[StepOutcome]:
    """Every step, of a goal of up to STEPS_LISTED; of more (`total`, a goal of thousands),
    those that did not succeed (up to STEPS_LISTED) and the last LATEST_LISTED that did, in the
    report's order."""
    if total <= STEPS_LISTED:
        return steps
    keep = {id(s) for s in [s for s in steps if s.status != "succeeded"][:STEPS_LISTED]}
    keep |= {id(s) for s in [s for s in steps if s.status == "succeeded"][-LATEST_LISTED:]}
    return [s for s in steps if id(s) in keep]


def _status(step: StepOutcome) -> str:
    return f"{step.status} (reused)" if step.reused and step.status == "succeeded" else step.status


def _heading(step: StepOutcome) -> str:
    return step.name if step.plan_version is None else f"{step.name} (plan v{step.plan_version})"


def _output_section(store: ArtifactStore, step: StepOutcome) -> list[str]:
    if step.output is None:
        return ["_No output was recorded._"]
    try:
        text = store.get_text(step.output)
    except ArtifactMissing:
        return [f"_Output artifact `{step.output.digest}` is missing from the artifact store._"]
    except ArtifactCorrupt:
        return [f"_Output artifact `{step.output.digest}` is corrupt in the artifact store (digest mismatch)._"]
    if len(text) <= OUTPUT_CAP_CHARS:
        return _fenced(text)
    return [
        *_fenced(text[:OUTPUT_CAP_CHARS]),
        "",
        f"_Truncated: showing {OUTPUT_CAP_CHARS} of {len(text)} characters; "
        f"full output in artifact `{step.output.digest}`._",
    ]


def _first_line(store: ArtifactStore, step: StepOutcome) -> str:
    try:
        text = store.get_text(step.output) if step.output is not None else ""
    except (ArtifactMissing, ArtifactCorrupt):
        text = ""
    return text.splitlines()[0] if text else f"wait step '{step.name}': its output is missing"


def _fenced(text: str) -> list[str]:
    # A fence longer than any backtick run inside, so output containing ``` cannot close it early.
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, text.rstrip("\n"), fence]


def _quote(text: str) -> list[str]:
    return [f"> {line}".rstrip() for line in text.strip().splitlines()] or [">"]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cell(text: str) -> str:
    return _one_line(text).replace("|", "\\|")


def excerpt_of(report: str, limit: int = EXCERPT_CHARS) -> str:
    """The start of the report, cut at a line break when one is near, for CLI output and the goal result."""
    if len(report) <= limit:
        return report
    cut = report.rfind("\n", 0, limit)
    if cut < limit // 2:
        cut = limit - 1
    return report[:cut].rstrip() + "\n…"


def with_past_steps(store: ArtifactStore, input: ReportInput) -> ReportInput:
    """A large goal's settled steps stored out of its state (workflows/goal/past.py): the
    latest chunks read back, newest first, until they hold the last LATEST_LISTED that
    succeeded, and put before its other steps (they settled first); what was not read stays
    counted (`past_counts`, `past_tokens`, `past_cost_usd`), not listed. Reading every chunk of
    100,000 steps took the report seconds."""
    if not input.past:
        return input
    counts, tokens, cost = Counter(input.past_counts), input.past_tokens, input.past_cost_usd
    read: list[StepOutcome] = []
    for ref in reversed(input.past):
        try:
            nodes = PastChunk.model_validate_json(store.get_text(ref)).nodes
        except (ArtifactMissing, ArtifactCorrupt, ValidationError):
            break  # what it holds stays counted, not listed: the report is still written
        steps = [step_outcome(node) for node in nodes]
        read = steps + read
        counts.subtract(s.status for s in steps)
        tokens, cost = tokens - sum(s.tokens for s in steps), cost - sum(s.cost_usd for s in steps)
        if sum(s.status == "succeeded" for s in read) >= LATEST_LISTED:
            break
    left = {status: n for status, n in counts.items() if n > 0}
    update = {"steps": read + input.steps, "past": [], "past_counts": left, "past_tokens": max(tokens, 0)}
    return input.model_copy(update={**update, "past_cost_usd": max(cost, 0.0)})


class ReportActivities:
    """Worker-side report writer. Register `ReportActivities(store).write_report` with the worker."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store

    @activity.defn(name=Activities.WRITE_REPORT)
    async def write_report(self, input: ReportInput) -> ReportResult:
        fault_point("report")
        # Loading every step's output is disk I/O; keep it off the worker's event loop, which
        # heartbeats meanwhile so a killed worker is noticed in seconds (workflows/shared/retries.py).
        async with Heartbeat(lambda: f"writing the report of {len(input.steps)} steps"):
            input = await asyncio.to_thread(with_past_steps, self.store, input)
            report = await asyncio.to_thread(render_report, self.store, input)
            ref = await asyncio.to_thread(self.store.put_text, report, "text/markdown")
        return ReportResult(report=ref, excerpt=excerpt_of(report))
