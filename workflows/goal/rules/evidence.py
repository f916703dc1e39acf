"""Re-planning on evidence (issue 20, section 4): what settled steps state, and when
their results call for a new plan. Pure: no I/O, clocks or randomness; the goal's
planner (workflows/goal/planner.py) feeds it the steps that settle, asks it for a
trigger, and acts on it.

Three triggers besides the drift check, judged without a model call:
- conflicting evidence: a step concludes the opposite of a conclusion another step
  recorded (same claim, once normalised; opposite value);
- isomorphic results: the last N settled steps ended in the same class of error (its
  text with paths, quoted names and numbers stripped) or named the same root cause;
- declining marginal value: the last N finished steps added, on average, less than a
  threshold of new information. New information is measured as the stall ladder does
  (workflows/goal/rules/stall.py): the share of a step's output shingles (word 3-grams of its
  normalised preview) not seen in the previews of the steps that finished before it.

How a step states what it found, in its output (llm and agent steps):
    CONCLUSION: <claim> = true|false
    ROOT CAUSE: <cause>
or an output that is one JSON object {"conclusions": [{"claim": …, "holds": …}],
"root_cause": …}. The model activities read them from the whole output with
`statement_lines` (this module's parser, so the activity and the workflow read alike)
and return them as lines in their result; `record_settled` reads those lines. A result
without them (None) has its statements read from the step's preview (the first 200
characters of its output).

Re-planning is sparse by design: after a re-plan on evidence, at least N more steps
must settle and a minimum time pass before the next (`spacing_left`), and each
trigger judges only steps that settled under the current plan version, so the same
evidence never fires twice.

What happens to each step in flight at a re-plan is decided per step (`in_flight_choice`):
a trigger that waits waits for all of them; under one that cancels, a step the new plan
keeps unchanged goes on, one it changes or drops is cancelled, unless a remote write or
irreversible effect of its own is in the air: cutting that off would leave an effect
nobody knows happened, so it is let finish and discarded (it settles, what it did is
recorded, then it is void and the new plan takes over; `PendingReplan` holds the new
plan until then).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from perdure.workflows.goal.contracts.plan import Plan
from perdure.workflows.goal.rules.stall import fingerprint, normalise_output, novelty

TriggerKind = Literal["conflicting evidence", "isomorphic results", "declining value"]
# What happens to the steps in flight when a trigger re-plans:
# - cancel: the planner is asked at once; steps in flight that the new plan changes or
#   drops are cancelled, those it keeps go on;
# - wait: no new step starts; the planner is asked once the steps in flight settled,
#   and their results are part of what it is told;
# - let finish and discard: never a trigger's policy, the one a step that `cancel` would
#   cut off gets when an effect of its own is in the air (`in_flight_choice`).
InFlightPolicy = Literal["wait", "cancel", "let finish and discard"]
# What one step in flight gets under a trigger that cancels (`go on`: the new plan keeps it unchanged).
InFlightChoice = Literal["cancel", "let finish and discard", "go on"]
IN_FLIGHT_POLICY: dict[str, tuple[InFlightPolicy, str]] = {
    "conflicting evidence": ("cancel", "work in flight may rest on the disputed claim"),
    "isomorphic results": ("cancel", "work in flight is likely to end the same way"),
    "declining value": ("wait", "nothing in flight is wrong, and cutting paid work off would waste it"),
}

MAX_CONCLUSIONS = 200
MAX_UNRESOLVED = 20
MAX_RECENT = 20
# Outputs whose shingles count as already seen when judging the next one.
PRINTS_KEPT = 32
MAX_CLAIM_CHARS = 160
# The statement lines a model activity returns from a whole output: the root cause (only
# the first is read) and then the conclusions in order, at most this many lines of at
# most this many characters (a conclusion line is at most 220: its claim is at most 200).
MAX_STATEMENTS = 12
MAX_STATEMENT_CHARS = 400
_JSON_CLAIM_CHARS = 200
_CAUSE_LINE, _CONCLUSION_LINE = "ROOT CAUSE: ", "CONCLUSION: "

_CONCLUSION = re.compile(
    r"conclusion:\s*(?P<claim>(?:(?!conclusion:|root[ _-]cause:)[^=\n]){1,200}?)\s*=\s*(?P<value>true|false)\b",
    re.IGNORECASE,
)
_ROOT_CAUSE = re.compile(
    r"root[ _-]cause:\s*(?P<cause>.+?)\s*(?=$|\n|;|\.(?:\s|$)|conclusion:|root[ _-]cause:)",
    re.IGNORECASE,
)
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_PATH = re.compile(r"(?:[\w.~<>-]*[/\\])+[\w.<>-]*|\b[\w-]+\.[a-z][a-z0-9]{0,4}\b")
_NUMBER = re.compile(r"\d+")
_PUNCT_ENDS = " \t.,;:!?\"'`"


class Conclusion(BaseModel):
    """A claim a step stated, with its source: valid while that step's output stands."""

    claim: str
    key: str = Field(description="The claim normalised: what two conclusions are compared by.")
    holds: bool
    node: str
    node_key: str | None = None
    at: datetime
    contradicted_by: str | None = Field(default=None, description="The step whose conclusion disputes it.")


class Contradiction(BaseModel):
    """Two steps' opposite conclusions on one claim that no re-plan has seen yet."""

    claim: str
    earlier: str
    earlier_holds: bool
    node: str
    holds: bool

    def describe(self) -> str:
        return (
            f"step '{self.node}' concluded '{self.claim}' {_says(self.holds)}, "
            f"step '{self.earlier}' had concluded it {_says(self.earlier_holds)}"
        )


class SettledOutcome(BaseModel):
    """One step that settled by its own work (not reused), in the order they settled."""

    node: str
    status: Literal["succeeded", "failed"]
    outcome_class: str | None = Field(
        default=None, description="'error: …' or 'root cause: …', normalised; None: neither."
    )
    new_information: float | None = Field(default=None, description="Finished steps: share of its output that is new.")


class EvidenceTrigger(BaseModel):
    kind: TriggerKind
    evidence: str
    in_flight: InFlightPolicy
    why: str = Field(description="Why that is what happens to the steps in flight.")


class PendingReplan(BaseModel):
    """A re-plan on evidence the planner has answered, waiting for the steps it lets finish
    and discard to settle; nothing new starts meanwhile. In the state, so a continue-as-new
    between their settling and the new plan's adoption keeps the answer."""

    trigger: EvidenceTrigger
    plan: Plan
    choices: dict[str, str] = Field(description="Step in flight -> what happens to it and why.")
    let_finish: list[str]


class EvidenceLog(BaseModel):
    """What the goal has learned from its settled steps, carried across continue-as-new."""

    conclusions: list[Conclusion] = Field(default_factory=list)
    unresolved: list[Contradiction] = Field(default_factory=list)
    recent: list[SettledOutcome] = Field(
        default_factory=list, description="Steps settled under plan version `plan_version`, oldest first."
    )
    prints: list[str] = Field(default_factory=list, description="Sketches of the latest finished outputs.")
    plan_version: int = 0
    settled: int = Field(default=0, description="Steps settled by their own work so far.")
    last_replan_settled: int | None = None
    last_replan_at: datetime | None = None
    deferred: str | None = Field(default=None, description="The trigger last reported as held off by the spacing.")
    pending: PendingReplan | None = None


# --- reading what a step states ------------------------------------------------


def claim_key(claim: str) -> str:
    """Case, spacing and surrounding punctuation do not make a different claim."""
    return " ".join(claim.lower().split()).strip(_PUNCT_ENDS)[:MAX_CLAIM_CHARS]


def read_statements(text: str) -> tuple[list[tuple[str, bool]], str | None]:
    """The conclusions (claim, holds) and the root cause a step's output states."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except ValueError:
            data = None
        if isinstance(data, dict):
            return _json_statements(data)
    conclusions = [
        (" ".join(m["claim"].split()).strip(_PUNCT_ENDS), m["value"].lower() == "true")
        for m in _CONCLUSION.finditer(text)
    ]
    conclusions = [(claim, holds) for claim, holds in conclusions if claim]
    cause = _ROOT_CAUSE.search(text)
    return conclusions, (claim_key(cause["cause"]) or None) if cause else None


def _json_statements(data: dict) -> tuple[list[tuple[str, bool]], str | None]:
    found = []
    for item in data.get("conclusions") or []:
        if isinstance(item, dict) and isinstance(item.get("claim"), str) and isinstance(item.get("holds"), bool):
            claim = " ".join(item["claim"].split()).strip(_PUNCT_ENDS)
            if claim:
                found.append((claim, item["holds"]))
    cause = data.get("root_cause")
    return found, (claim_key(cause) or None) if isinstance(cause, str) else None


def statement_lines(text: str) -> list[str]:
    """What a whole output states, as lines `read_statement_lines` reads as `read_statements`
    reads the output: `ROOT CAUSE: …` (the first one, the only one read) and then one
    `CONCLUSION: <claim> = true|false` per conclusion; for an output that is one JSON
    object, each as a one-line JSON object of the same shape (a claim may hold `=`). At
    most MAX_STATEMENTS lines of at most MAX_STATEMENT_CHARS: a longer cause line is cut
    (its key is its first 160 characters), a longer JSON line, which a cut would break, is
    left out."""
    stripped = text.strip()
    data = None
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except ValueError:
            data = None
    if isinstance(data, dict):
        conclusions, _ = _json_statements(data)
        cause = data.get("root_cause")
        stated = isinstance(cause, str) and claim_key(cause)
        lines = [_one_line({"root_cause": " ".join(cause.split())[:_JSON_CLAIM_CHARS]})] if stated else []
        lines += [
            _one_line({"conclusions": [{"claim": claim[:_JSON_CLAIM_CHARS], "holds": holds}]})
            for claim, holds in conclusions
        ]
        lines = [line for line in lines if len(line) <= MAX_STATEMENT_CHARS]
    else:
        conclusions, cause = read_statements(text)
        found = _ROOT_CAUSE.search(text)
        lines = [f"{_CAUSE_LINE}{found['cause']}"[:MAX_STATEMENT_CHARS]] if cause and found else []
        lines += [f"{_CONCLUSION_LINE}{claim} = {'true' if holds else 'false'}" for claim, holds in conclusions]
    return lines[:MAX_STATEMENTS]


def _one_line(data: dict) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(", ", ": "))


def read_statement_lines(lines: list[str]) -> tuple[list[tuple[str, bool]], str | None]:
    """The conclusions and the root cause stated by `statement_lines`' lines."""
    conclusions: list[tuple[str, bool]] = []
    cause: str | None = None
    for line in lines:
        found, stated = read_statements(line)
        # A line states one thing: a cause may read like a conclusion ("root cause: conclusion: …").
        if not line.startswith(_CAUSE_LINE):
            conclusions += found
        if not line.startswith(_CONCLUSION_LINE):
            cause = cause or stated
    return conclusions, cause


def error_class(error: str) -> str:
    """An error's text without what differs between two instances of the same error:
    paths and file names, quoted names, numbers (and the stall module's volatile tokens)."""
    text = _QUOTED.sub("<q>", normalise_output(error))
    text = _PATH.sub("<path>", text)
    return _NUMBER.sub("<n>", text)[:MAX_CLAIM_CHARS]


# --- taking in a settled step --------------------------------------------------


def record_settled(
    log: EvidenceLog,
    *,
    node: str,
    node_key: str | None,
    status: Literal["succeeded", "failed"],
    text: str,
    states_findings: bool,
    at: datetime,
    plan_version: int,
    is_current: Callable[[str, str | None], bool],
    statements: list[str] | None = None,
) -> None:
    """Take in one step that settled by its own work: `text` is its output's preview
    (succeeded) or its error (failed); `states_findings`: its conclusions and root cause
    are read (a model's step), from `statements` (the lines its activity read from the
    whole output) or, for a result without them (None), from the preview.
    `is_current(node, key)`: that step's output still stands (not voided or run again since)."""
    if plan_version != log.plan_version:
        # Each trigger judges the steps of the current plan only: a new plan has answered the rest.
        log.recent, log.plan_version = [], plan_version
    log.settled += 1
    outcome = SettledOutcome(node=node, status=status)
    if status == "failed":
        outcome.outcome_class = f"error: {error_class(text)}"
    else:
        sketch = fingerprint([text])
        outcome.new_information = novelty(log.prints, sketch)
        log.prints = [*log.prints, sketch][-PRINTS_KEPT:]
        if not states_findings:
            conclusions, cause = [], None
        elif statements is not None:
            conclusions, cause = read_statement_lines(statements)
        else:
            conclusions, cause = read_statements(text)
        if cause:
            outcome.outcome_class = f"root cause: {cause}"
        _record_conclusions(log, node, node_key, conclusions, at, is_current)
    log.recent = [*log.recent, outcome][-MAX_RECENT:]


def _record_conclusions(
    log: EvidenceLog,
    node: str,
    node_key: str | None,
    conclusions: list[tuple[str, bool]],
    at: datetime,
    is_current: Callable[[str, str | None], bool],
) -> None:
    # A step run again replaces what its earlier run concluded; so does one whose source was voided.
    log.conclusions = [c for c in log.conclusions if c.node != node and is_current(c.node, c.node_key)]
    for claim, holds in conclusions:
        key = claim_key(claim)
        for earlier in log.conclusions:
            if earlier.key == key and earlier.contradicted_by is None and earlier.holds != holds:
                earlier.contradicted_by = node
                log.unresolved.append(
                    Contradiction(
                        claim=claim, earlier=earlier.node, earlier_holds=earlier.holds, node=node, holds=holds
                    )
                )
        log.conclusions.append(Conclusion(claim=claim, key=key, holds=holds, node=node, node_key=node_key, at=at))
    del log.unresolved[:-MAX_UNRESOLVED]
    if len(log.conclusions) > MAX_CONCLUSIONS:
        disputed = [c for c in log.conclusions if c.contradicted_by is not None]
        drop = {id(c) for c in disputed[: len(log.conclusions) - MAX_CONCLUSIONS]}
        log.conclusions = [c for c in log.conclusions if id(c) not in drop][-MAX_CONCLUSIONS:]


# --- judging ---------------------------------------------------------------------


def trigger(log: EvidenceLog, window: int, min_new_information: float) -> EvidenceTrigger | None:
    """The trigger the evidence calls for, first in the order conflicting evidence,
    isomorphic results, declining value; None when none holds (or `window` is 0)."""
    if window <= 0:
        return None
    if log.unresolved:
        shown = "; ".join(c.describe() for c in log.unresolved[:3])
        more = f" (and {len(log.unresolved) - 3} more)" if len(log.unresolved) > 3 else ""
        return _trigger("conflicting evidence", shown + more)
    last = log.recent[-window:]
    if len(last) == window and last[0].outcome_class is not None:
        if all(o.outcome_class == last[0].outcome_class for o in last):
            names = ", ".join(o.node for o in last)
            return _trigger(
                "isomorphic results", f"the last {window} settled steps ({names}) all ended in {last[0].outcome_class}"
            )
    if min_new_information > 0:
        finished = [o for o in log.recent if o.new_information is not None][-window:]
        if len(finished) == window:
            mean = sum(o.new_information or 0.0 for o in finished) / window
            if mean < min_new_information:
                names = ", ".join(o.node for o in finished)
                return _trigger(
                    "declining value",
                    f"the last {window} finished steps ({names}) added {mean:.0%} new information on average, "
                    f"under {min_new_information:.0%}",
                )
    return None


def _trigger(kind: TriggerKind, evidence: str) -> EvidenceTrigger:
    policy, why = IN_FLIGHT_POLICY[kind]
    return EvidenceTrigger(kind=kind, evidence=evidence, in_flight=policy, why=why)


def in_flight_choice(*, changed: bool, effect_in_air: str | None) -> tuple[InFlightChoice, str]:
    """What happens to one step in flight at a re-plan whose trigger cancels, and why.
    `changed`: the new plan changes or drops it; `effect_in_air`: what of its own is on
    its way outside and cannot be called back ("a remote write"), None: nothing is."""
    if not changed:
        return "go on", "the new plan keeps it unchanged"
    if effect_in_air is not None:
        return "let finish and discard", f"{effect_in_air} may be in flight"
    return "cancel", "no effect of its own is in flight"


def spacing_left(log: EvidenceLog, window: int, spacing_s: float, now: datetime) -> str | None:
    """What keeps the next re-plan on evidence from happening yet (None: nothing): at
    least `window` steps settled and `spacing_s` seconds since the last one."""
    if log.last_replan_at is None or log.last_replan_settled is None:
        return None
    steps = log.settled - log.last_replan_settled
    seconds = (now - log.last_replan_at).total_seconds()
    short = []
    if steps < window:
        short.append(f"{steps} of {window} steps settled")
    if seconds < spacing_s:
        short.append(f"{seconds:.0f} s of {spacing_s:g} s passed")
    return f"since the last re-plan on evidence: {', '.join(short)}" if short else None


def note_replanned(log: EvidenceLog, now: datetime, plan_version: int) -> None:
    """A re-plan on evidence was made (or tried): its evidence is answered, spacing starts."""
    log.unresolved, log.recent, log.deferred = [], [], None
    log.plan_version = plan_version
    log.last_replan_settled, log.last_replan_at = log.settled, now


def standing(log: EvidenceLog, is_current: Callable[[str, str | None], bool]) -> list[Conclusion]:
    """Conclusions still valid: not disputed, and their step's output still stands."""
    return [c for c in log.conclusions if c.contradicted_by is None and is_current(c.node, c.node_key)]


def revision_reason(trigger: EvidenceTrigger, log: EvidenceLog, valid: list[Conclusion]) -> str:
    """What the planner is told: the trigger and its evidence, the conclusions that still
    hold (kept) and those in dispute."""
    lines = [f"re-plan on evidence ({trigger.kind}): {trigger.evidence}."]
    if valid:
        lines.append("Conclusions that still hold (keep them):")
        lines += [f"- {c.claim}: {_says(c.holds)} (step '{c.node}')" for c in valid[-20:]]
    disputed = [c for c in log.conclusions if c.contradicted_by is not None]
    if disputed:
        lines.append("Conclusions in dispute (do not build on them):")
        lines += [
            f"- {c.claim}: {_says(c.holds)} per step '{c.node}', disputed by step '{c.contradicted_by}'"
            for c in disputed[-10:]
        ]
    return "\n".join(lines)


def _says(holds: bool) -> str:
    return "holds" if holds else "does not hold"
