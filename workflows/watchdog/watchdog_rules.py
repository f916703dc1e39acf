"""The watchdog's judgement: findings and interventions from one scan, the
watchdog's memory and the time. Pure: no I/O, no clock, no Temporal; the
workflow passes `now` in, so a run replays to the same decisions.

| finding | when | intervention |
|---|---|---|
| healthy | none of the below | none |
| parked | parked, before its expiry | none, ever: a parked goal is never woken |
| parked_past_expiry | parked and past its expiry | none: the goal's own timer asks the person |
| waiting_device | steps wait for an offline device | none: the goal resumes by itself when it is back |
| needs_human | an open question older than `unanswered_after_s` | none: asking again would double-ask |
| step_failed | a step failed while the goal runs on; the finding has its error | none: a nudge cannot undo it |
| stalled | not parked, no open question, nothing settled for the goal's `stall_after_s` | nudge; escalate later |
| looping | a node still running past stall-ladder rung `looping_rung` | escalate once |
| over_budget | a budget dimension at or past 100% while the goal runs | escalate once per dimension |
| failing | a pending activity at attempt >= `failing_attempts` | incident, resolved when it clears |
| unreachable | an activity scheduled `unreachable_after_s` ago and never started | incident |
| unresponsive | the goal did not answer its progress query | incident |

Stall ordering, deterministic: the first run that sees a stall episode sends
the nudge (a steer); the first run at least `escalate_after` x `stall_after_s`
after that nudge that still sees the same episode sends the escalation (a
question card). One of each per episode, ever. An episode starts when the goal
last made progress, or when a legitimate wait (parked, waiting for a person)
ended, whichever is later: a goal just resumed or answered is not stalled.

Request ids are `wd-<goal>-<finding>-<action>-<episode>` with the episode a
timestamp, node or budget dimension taken from what the goal reports. A run
whose memory was lost computes the same id, and the goal's inbox dedupes it.
The message texts depend on the episode only, never on the run, so such a
retry is the same message, not a conflicting one. While a goal has an open
infrastructure incident its stall gets no nudge: the model cannot fix a
failing API.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime, timedelta

from perdure.workflows.shared.durations import duration_text
from perdure.workflows.shared.statuses import ENDED_PHASES
from perdure.workflows.watchdog.watchdog_contracts import (
    Assessment,
    Finding,
    GoalMemory,
    GoalObservation,
    Incident,
    IncidentKind,
    Intervention,
    InterventionAction,
    InterventionOutcome,
    RuleBook,
    RunSummary,
    SentIntervention,
    Verdict,
    WatchdogMemory,
    WatchdogRules,
)

MAX_REQUEST_ID = 128
RESOLVED_KEPT = 100
# What was sent to a goal is forgotten this long after sending once the goal is no
# longer listed, not at once: a goal missing from one scan (visibility lag, the
# max_goals cap) must not be messaged again when it reappears.
SENT_RETENTION = timedelta(days=7)
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")


def episode_of(moment: datetime) -> str:
    """A timestamp usable in a request id, to the millisecond, always in UTC."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y%m%dT%H%M%S") + f".{utc.microsecond // 1000:03d}Z"


def request_id(goal_id: str, finding: str, action: InterventionAction, episode: str) -> str:
    """`wd-<goal>-<finding>-<action>-<episode>`, within the inbox's id rules (128
    characters of [A-Za-z0-9._:-]); a long goal id is shortened with a digest."""
    goal, ep = _UNSAFE.sub("_", goal_id), _UNSAFE.sub("_", episode)
    rid = f"wd-{goal}-{finding}-{action}-{ep}"
    if len(rid) <= MAX_REQUEST_ID:
        return rid
    digest = hashlib.sha256(f"{goal_id}\n{episode}".encode()).hexdigest()[:16]
    return f"wd-{goal[:40]}-{finding}-{action}-{ep[:30]}.{digest}"[:MAX_REQUEST_ID]


def span(seconds: float) -> str:
    """A duration for people: 45 s, 30 min, 2.5 h, 3 d."""
    return duration_text(seconds, days=True)


def incident_id(goal_id: str, kind: str, subject: str) -> str:
    return f"{goal_id}/{kind}/{subject}"


def is_waiting(goal: GoalObservation) -> bool:
    """Parked, waiting for a person, or with nothing running but steps waiting for an
    offline device or for their planned time (wait steps), or only steps waiting for a
    quota slot: a legitimate reason not to progress."""
    waits = bool(goal.waiting_for_devices) or bool(goal.waiting_on_timers)
    # A step waiting for its quota slot shows as running; only its slot can move it on.
    quota = bool(goal.waiting_for_quota) and set(goal.running) <= set(goal.waiting_for_quota)
    return goal.parked or bool(goal.open_questions) or (waits and not goal.running) or quota


def wait_ended_at(goal: GoalObservation, previous: GoalMemory | None, now: datetime) -> datetime | None:
    """When the goal's last legitimate wait ended, as far as the watchdog saw it."""
    if goal.query_error is not None:
        return previous.wait_ended_at if previous else None
    if is_waiting(goal):
        return None
    if previous is not None and previous.waiting:
        return now
    return previous.wait_ended_at if previous else None


def stall_clock_start(goal: GoalObservation, previous: GoalMemory | None, now: datetime) -> datetime | None:
    starts = [t for t in (goal.last_progress_at or goal.started_at, wait_ended_at(goal, previous, now)) if t]
    return max(starts) if starts else None


def observed_faults(goal: GoalObservation, now: datetime, rules: WatchdogRules) -> list[tuple[IncidentKind, str, str]]:
    """(kind, subject, detail) of each infrastructure fault the scan shows on this goal."""
    faults: list[tuple[IncidentKind, str, str]] = []
    if goal.query_error is not None:
        faults.append(("unresponsive", "progress query", f"no answer to the progress query: {goal.query_error}"))
    failing: dict[str, str] = {}
    for activity in goal.pending:
        if activity.attempt >= rules.failing_attempts and activity.last_failure:
            failing.setdefault(
                activity.activity_type,
                f"{activity.activity_type} at attempt {activity.attempt}; last failure: {activity.last_failure}",
            )
        elif (
            activity.state == "scheduled"
            and activity.attempt == 1
            and activity.scheduled_at is not None
            and (now - activity.scheduled_at).total_seconds() >= rules.unreachable_after_s
        ):
            queue = activity.task_queue or "its task queue"
            waited = span((now - activity.scheduled_at).total_seconds())
            faults.append(
                (
                    "unreachable",
                    f"{activity.activity_type} on {queue}",
                    f"{activity.activity_type} was scheduled {waited} ago on {queue} and no worker has started it",
                )
            )
    faults.extend(("failing", subject, detail) for subject, detail in sorted(failing.items()))
    return faults


def scope_applies(scope: str, goal_id: str) -> bool:
    """'all', 'goal=ID' (that goal) or 'tag=NAME': goals carry no tags, so a tag is the
    prefix of the ids a family of goals is started under (`nightly-…`)."""
    kind, _, value = scope.partition("=")
    if scope == "all":
        return True
    if kind == "goal":
        return goal_id == value
    if kind == "tag":
        return goal_id == value or goal_id.startswith(f"{value}-")
    return False


def scope_rank(scope: str) -> int:
    return {"all": 0, "tag": 1, "goal": 2}.get(scope.partition("=")[0], 3)


def effective_rules(base: WatchdogRules, book: RuleBook | None, goal_id: str | None = None) -> WatchdogRules:
    """The schedule's rules overlaid by the rule book: all, then tags (by name), then the goal."""
    if book is None or not book.scopes:
        return base
    merged = base.model_dump()
    for scope in sorted(book.scopes, key=lambda s: (scope_rank(s), s)):
        if scope == "all" or (goal_id is not None and scope_applies(scope, goal_id)):
            merged.update({k: v for k, v in book.scopes[scope].items() if k in merged})
    return WatchdogRules.model_validate(merged)


def assess(
    goals: list[GoalObservation],
    memory: WatchdogMemory,
    now: datetime,
    rules: WatchdogRules,
    book: RuleBook | None = None,
) -> Assessment:
    """Findings for every goal, the interventions to send, and the incidents after this run.
    `book` holds the maintainers' rules; without one, `rules` decide for every goal."""
    findings: list[Finding] = []
    interventions: list[Intervention] = []
    incidents = {i.id: i.model_copy() for i in memory.open_incidents()}
    seen_faults: set[str] = set()
    base = rules
    for goal in sorted(goals, key=lambda g: g.goal_id):
        rules = effective_rules(base, book, goal.goal_id)
        if rules.stall_after_s is not None:
            goal = goal.model_copy(update={"stall_after_s": rules.stall_after_s})
        faults = observed_faults(goal, now, rules)
        for kind, subject, detail in faults:
            key = incident_id(goal.goal_id, kind, subject)
            seen_faults.add(key)
            incident = incidents.get(key)
            if incident is None:
                incidents[key] = Incident(
                    id=key,
                    goal_id=goal.goal_id,
                    kind=kind,
                    subject=subject,
                    detail=detail,
                    opened_at=now,
                    last_seen_at=now,
                )
            else:
                incident.detail, incident.last_seen_at, incident.checks = detail, now, incident.checks + 1
            findings.append(Finding(goal_id=goal.goal_id, kind=kind, detail=detail, episode=key))
        goal_findings, goal_interventions = _judge_goal(goal, memory, now, rules, has_fault=bool(faults))
        findings.extend(goal_findings)
        interventions.extend(goal_interventions)
    open_goals = {g.goal_id for g in goals}
    # A goal the server could not describe this time: its activity faults are unknown, not cleared.
    undescribed = {g.goal_id for g in goals if not g.pending_known}
    for key, incident in incidents.items():
        if incident.goal_id in undescribed and incident.kind in ("failing", "unreachable"):
            seen_faults.add(key)
    resolved = []
    for key, incident in incidents.items():
        if key in seen_faults:
            continue
        incident.resolved_at = now
        incident.checks += 1
        incident.resolution = (
            "cleared: no longer seen" if incident.goal_id in open_goals else "the goal is no longer running"
        )
        resolved.append(incident)
    still_open = [i for key, i in incidents.items() if key in seen_faults]
    return Assessment(
        findings=findings,
        interventions=interventions,
        incidents=sorted(still_open, key=lambda i: i.id) + sorted(resolved, key=lambda i: i.id),
    )


def _judge_goal(
    goal: GoalObservation, memory: WatchdogMemory, now: datetime, rules: WatchdogRules, has_fault: bool
) -> tuple[list[Finding], list[Intervention]]:
    gid = goal.goal_id
    if goal.query_error is not None:
        return [], []  # nothing to judge but the fault itself
    findings: list[Finding] = []
    interventions: list[Intervention] = []
    ended = goal.phase in ENDED_PHASES
    # A parked goal gets no message of any kind: only its own expiry timer asks.
    may_message = not ended and not goal.parked

    def once(action: InterventionAction, finding, episode: str, text: str) -> Intervention | None:
        rid = request_id(gid, finding, action, episode)
        if rid in memory.sent:
            return None
        return Intervention(goal_id=gid, action=action, finding=finding, episode=episode, request_id=rid, text=text)

    if goal.parked:
        if goal.park_expires_at is not None and now >= goal.park_expires_at:
            findings.append(
                Finding(
                    goal_id=gid,
                    kind="parked_past_expiry",
                    detail=f"parked past its expiry ({goal.park_expires_at:%Y-%m-%d %H:%M} UTC); "
                    "the goal asks the person itself",
                    episode=episode_of(goal.park_expires_at),
                )
            )
        else:
            until = f" until {goal.park_expires_at:%Y-%m-%d %H:%M} UTC" if goal.park_expires_at else ""
            findings.append(Finding(goal_id=gid, kind="parked", detail=f"parked{until}"))

    if goal.waiting_for_devices:
        waits = ", ".join(f"{node} on {device}" for node, device in sorted(goal.waiting_for_devices.items()))
        # Not a fault and not a stall: the goal goes on by itself when the device is back.
        findings.append(Finding(goal_id=gid, kind="waiting_device", detail=f"waiting for offline devices: {waits}"))

    if goal.open_questions and goal.oldest_question_at is not None:
        age = (now - goal.oldest_question_at).total_seconds()
        if age >= rules.unanswered_after_s:
            findings.append(
                Finding(
                    goal_id=gid,
                    kind="needs_human",
                    detail=f"{len(goal.open_questions)} open question(s), the oldest unanswered for {span(age)}: "
                    + "; ".join(goal.open_questions[:3]),
                    episode=episode_of(goal.oldest_question_at),
                )
            )

    if goal.failed_steps and not ended:
        count = max(goal.failed_count, len(goal.failed_steps))
        findings.append(
            Finding(
                goal_id=gid,
                kind="step_failed",
                detail=f"{count} step(s) failed: " + "; ".join(goal.failed_steps[:3]),
                episode=goal.failed_steps[0].partition(":")[0],
            )
        )

    for dimension, fraction in sorted(goal.budget.items()):
        if fraction >= 1.0 and not ended:
            findings.append(
                Finding(
                    goal_id=gid,
                    kind="over_budget",
                    detail=f"{dimension} at {fraction:.0%} of its budget while the goal still runs",
                    episode=dimension,
                )
            )
            if may_message:
                text = f"This goal has used up its {dimension} budget and is still running."
                interventions.append(once("escalate", "over_budget", dimension, text))

    if not is_waiting(goal) and not ended:
        looping = {n: r for n, r in sorted(goal.looping_nodes.items()) if r >= rules.looping_rung}
        for node, rung in looping.items():
            episode = f"{node}.r{rung}"
            findings.append(
                Finding(
                    goal_id=gid,
                    kind="looping",
                    detail=f"step '{node}' still runs after {rung} stall-ladder rungs",
                    episode=episode,
                )
            )
            text = (
                f"Step '{node}' has gone {rung} rungs up the stall ladder (reminded, told to switch approach"
                + (", a person asked" if rung >= 3 else "")
                + ") and still runs without new information."
            )
            interventions.append(once("escalate", "looping", episode, text))
        start = stall_clock_start(goal, memory.goals.get(gid), now)
        idle = (now - start).total_seconds() if start else 0.0
        if start is not None and idle >= goal.stall_after_s:
            episode = episode_of(start)
            muted = has_fault or bool(looping)
            why = " (not nudged: an infrastructure fault is open)" if has_fault else ""
            findings.append(
                Finding(
                    goal_id=gid,
                    kind="stalled",
                    detail=f"nothing settled for {span(idle)} (threshold {span(goal.stall_after_s)}); "
                    f"running: {', '.join(goal.running) or 'nothing'}{why}",
                    episode=episode,
                )
            )
            if not muted:
                interventions.append(_stall_step(goal, memory, now, rules, start, episode))

    if not findings:
        start = stall_clock_start(goal, memory.goals.get(gid), now)
        quiet = f"; last progress {span((now - start).total_seconds())} ago" if start else ""
        findings.append(Finding(goal_id=gid, kind="healthy", detail=f"{goal.phase} · {goal.percent_done}%{quiet}"))
    return findings, [i for i in interventions if i is not None]


def _stall_step(
    goal: GoalObservation, memory: WatchdogMemory, now: datetime, rules: WatchdogRules, start: datetime, episode: str
) -> Intervention | None:
    """Nudge first; escalate once the nudge has had `escalate_after` x stall_after_s to work."""
    gid = goal.goal_id
    since = f"{start:%Y-%m-%d %H:%M} UTC"
    threshold = span(goal.stall_after_s)
    nudge = request_id(gid, "stalled", "nudge", episode)
    sent = memory.sent.get(nudge)
    if sent is None:
        text = (
            f"[watchdog] No step of this goal has finished since {since}, longer than its stall threshold of "
            f"{threshold}. If you are repeating an approach, try a different one; if what you have is enough, "
            "finish the step with it."
        )
        return Intervention(
            goal_id=gid, action="nudge", finding="stalled", episode=episode, request_id=nudge, text=text
        )
    escalate = request_id(gid, "stalled", "escalate", episode)
    if escalate in memory.sent:
        return None
    if now - sent.sent_at < timedelta(seconds=rules.escalate_after * goal.stall_after_s):
        return None
    text = (
        f"No step of this goal has finished since {since}, longer than its stall threshold of {threshold}, "
        "and a nudge to the model has not helped."
    )
    return Intervention(
        goal_id=gid, action="escalate", finding="stalled", episode=episode, request_id=escalate, text=text
    )


def remember(
    memory: WatchdogMemory,
    goals: list[GoalObservation],
    assessment: Assessment,
    outcomes: list[InterventionOutcome],
    now: datetime,
    run_id: str,
    scan_seconds: float = 0.0,
) -> WatchdogMemory:
    """The memory after a run: what was sent (to open goals, and recently to any),
    incidents (open, then the latest resolved), and each open goal's findings."""
    open_goals = {g.goal_id for g in goals}
    delivered = {o.request_id for o in outcomes if o.sent}
    sent = {rid: s for rid, s in memory.sent.items() if s.goal_id in open_goals or now - s.sent_at < SENT_RETENTION}
    for item in assessment.interventions:
        if item.request_id in delivered:
            sent[item.request_id] = SentIntervention(
                goal_id=item.goal_id, action=item.action, finding=item.finding, episode=item.episode, sent_at=now
            )
    touched = {i.id for i in assessment.incidents}
    earlier = [i for i in memory.incidents if i.resolved_at is not None and i.id not in touched]
    open_now = [i for i in assessment.incidents if i.resolved_at is None]
    resolved = sorted(
        earlier + [i for i in assessment.incidents if i.resolved_at is not None],
        key=lambda i: (i.resolved_at, i.id),
    )[-RESOLVED_KEPT:]
    by_goal: dict[str, list[Finding]] = {}
    for finding in assessment.findings:
        by_goal.setdefault(finding.goal_id, []).append(finding)
    goal_memory = {}
    for goal in sorted(goals, key=lambda g: g.goal_id):
        previous = memory.goals.get(goal.goal_id)
        goal_memory[goal.goal_id] = GoalMemory(
            findings=by_goal.get(goal.goal_id, []),
            seen_at=now,
            waiting=is_waiting(goal) if goal.query_error is None else bool(previous and previous.waiting),
            wait_ended_at=wait_ended_at(goal, previous, now),
        )
    return WatchdogMemory(
        sent=dict(sorted(sent.items())),
        incidents=open_now + resolved,
        goals=goal_memory,
        last_run=RunSummary(
            run_id=run_id,
            at=now,
            goals=len(goals),
            counts=finding_counts(assessment.findings),
            interventions=sorted(delivered),
            scan_seconds=scan_seconds,
        ),
    )


def finding_counts(findings: list[Finding]) -> dict[str, int]:
    """Goals per finding kind (a goal with two findings of one kind counts once)."""
    kinds: dict[str, set[str]] = {}
    for finding in findings:
        kinds.setdefault(finding.kind, set()).add(finding.goal_id)
    return {kind: len(goals) for kind, goals in sorted(kinds.items())}


# --- the model's judgement of ambiguous goals -------------------------------------------
#
# Rules decide the clear cases; a goal the rules call healthy but whose recent steps
# add little new information, or whose step runs long, is ambiguous and asked about
# once per episode. An episode lasts while the goal's informative progress stays put:
# the plan version and the count of finished steps that brought new information, so a
# goal settling empty steps stays in one episode and costs one call, not one a tick.

LOW_INFORMATION = 0.2
RECENT_STEPS = 3
VERDICTS_KEPT = 200
VERDICT_KEYS = {"verdict", "reason", "confidence"}
VERDICT_ACTIONS: dict[str, InterventionAction] = {
    "spinning": "nudge",
    "drifting": "nudge",
    "stuck_on_person": "escalate",
}


_TERM = re.compile(r"[a-z][a-z0-9_-]{3,}")
_COMMON = frozenset(
    "that this with from have were what when which into about after before them then than some more most "
    "also only just make made does done each their there these those would could should goal step steps "
    "output result results found none".split()
)


def judge_episode(goal: GoalObservation) -> str:
    return f"p{goal.plan_version}.i{goal.informative_steps}"


def judgeable(goal: GoalObservation, findings: list[Finding]) -> bool:
    """Healthy by the rules, running and not waiting: what a model may be asked about."""
    if goal.query_error is not None or any(f.kind != "healthy" for f in findings if f.goal_id == goal.goal_id):
        return False
    return goal.phase not in ENDED_PHASES and not is_waiting(goal)


def ambiguity(goal: GoalObservation, findings: list[Finding], now: datetime) -> str | None:
    """Why the rules alone cannot tell whether this goal is healthy, or None."""
    if not judgeable(goal, findings):
        return None
    recent = goal.new_information[-RECENT_STEPS:]
    if len(recent) >= RECENT_STEPS and sum(recent) / len(recent) < LOW_INFORMATION:
        return f"its last {len(recent)} finished steps added {sum(recent) / len(recent):.0%} new information on average"
    if goal.running and goal.last_progress_at is not None:
        idle = (now - goal.last_progress_at).total_seconds()
        if idle >= goal.stall_after_s / 2:
            return f"step(s) {', '.join(goal.running)} running for {span(idle)} with nothing settled"
    return None


def terms(text: str) -> set[str]:
    """The words of a text that can tie a step to its goal (four letters or more, not filler)."""
    return {word for word in _TERM.findall(text.lower()) if word not in _COMMON}


def off_goal(goal: GoalObservation, findings: list[Finding]) -> str | None:
    """Ambiguous for drift: the last RECENT_STEPS conclusions share no term with the goal's
    text (finished steps that do not map to the goal), or None. Cheap and blunt on purpose:
    it only decides whether to ask the model, which judges."""
    recent = goal.conclusions[-RECENT_STEPS:]
    wanted = terms(goal.goal_text)
    if len(recent) < RECENT_STEPS or not wanted or not judgeable(goal, findings):
        return None
    if any(wanted & terms(conclusion) for conclusion in recent):
        return None
    return f"its last {len(recent)} conclusions share no term with the goal"


# The judge is shown the new-information figures of the last this many finished steps: its
# call costs the same for a goal of 30 steps and one of 3,000 (the plan lines and conclusions
# it sees are capped where they are read, activities/watchdog/watchdog_visibility.py).
JUDGE_FIGURES_SHOWN = 20


def judge_prompt(goal: GoalObservation, why: str) -> str:
    shown = goal.new_information[-JUDGE_FIGURES_SHOWN:]
    figures = ", ".join(f"{share:.0%}" for share in shown) or "none yet"
    if len(shown) < len(goal.new_information):
        figures = f"(the last {len(shown)} of {len(goal.new_information)}) {figures}"
    lines = [
        f"Goal {goal.goal_id}: {goal.goal_text or '(no text)'}",
        f"Why you are asked: {why}.",
        f"Phase {goal.phase}, {goal.percent_done}% done, plan version {goal.plan_version}.",
        "Plan:",
        *[f"- {step}" for step in goal.plan],
        "Recent conclusions:",
        *[f"- {c}" for c in goal.conclusions or ["(none)"]],
        f"New information of each finished step, in order: {figures}.",
        "Is this goal healthy, spinning, drifting, or stuck on a person?",
    ]
    return "\n".join(lines)


def parse_verdict(goal_id: str, episode: str, raw: str, tokens: int, now: datetime) -> Verdict:
    """Strict: one JSON object with exactly verdict, reason and confidence, valid values."""
    base = {"goal_id": goal_id, "episode": episode, "at": now, "tokens": tokens}
    try:
        data = json.loads(raw)
    except ValueError:
        return Verdict(**base, malformed=f"not JSON: {raw[:120]!r}")
    if not isinstance(data, dict) or set(data) != VERDICT_KEYS:
        return Verdict(**base, malformed=f"expected exactly {sorted(VERDICT_KEYS)}: {raw[:120]!r}")
    verdict, reason, confidence = data["verdict"], data["reason"], data["confidence"]
    if verdict not in ("healthy", "spinning", "drifting", "stuck_on_person"):
        return Verdict(**base, malformed=f"unknown verdict {str(verdict)[:40]!r}")
    if not isinstance(reason, str) or not reason.strip():
        return Verdict(**base, malformed="no reason given")
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
        return Verdict(**base, malformed=f"confidence {confidence!r} is not a number from 0 to 1")
    return Verdict(**base, verdict=verdict, reason=reason.strip()[:400], confidence=float(confidence))


def judge_budget_left(memory: WatchdogMemory, rules: WatchdogRules, now: datetime) -> str | None:
    """None when another call fits today's budget, else why not."""
    calls, tokens = memory.judge_usage.get(f"{now.astimezone(UTC):%Y-%m-%d}", [0, 0])
    if calls >= rules.judge_calls_per_day:
        return f"the watchdog's model budget is spent: {calls} of {rules.judge_calls_per_day} calls today"
    if tokens >= rules.judge_tokens_per_day:
        return f"the watchdog's model budget is spent: {tokens} of {rules.judge_tokens_per_day} tokens today"
    return None


def verdict_step(goal_id: str, verdict: Verdict, memory: WatchdogMemory) -> tuple[Finding, Intervention | None]:
    """The finding a verdict makes, and the message it sends (once per episode)."""
    if verdict.verdict is None:
        detail = f"the model's reply was malformed, no action taken: {verdict.malformed}"
        return Finding(goal_id=goal_id, kind="unjudged", detail=detail, episode=verdict.episode), None
    detail = f"model: {verdict.verdict.replace('_', ' ')} ({verdict.confidence:.0%}): {verdict.reason}"
    if verdict.verdict == "healthy":
        return Finding(goal_id=goal_id, kind="judged_healthy", detail=detail, episode=verdict.episode), None
    finding = Finding(goal_id=goal_id, kind=verdict.verdict, detail=detail, episode=verdict.episode)
    action = VERDICT_ACTIONS[verdict.verdict]
    rid = request_id(goal_id, verdict.verdict, action, verdict.episode)
    if rid in memory.sent:
        return finding, None
    what = verdict.verdict.replace("_", " ")
    text = f"[watchdog] A review of this goal's recent work judged it {what}: {verdict.reason}"
    if action == "nudge":
        text += " Change approach, or finish the step with what you have if it is enough."
    item = Intervention(
        goal_id=goal_id, action=action, finding=verdict.verdict, episode=verdict.episode, request_id=rid, text=text
    )
    return finding, item


def remember_verdicts(memory: WatchdogMemory, verdicts: list[Verdict], note: str | None, now: datetime) -> None:
    """Keep the verdicts (latest VERDICTS_KEPT) and today's spend; in place, on the memory after a run."""
    day = f"{now.astimezone(UTC):%Y-%m-%d}"
    calls, tokens = memory.judge_usage.get(day, [0, 0])
    for verdict in verdicts:
        memory.verdicts[f"{verdict.goal_id}/{verdict.episode}"] = verdict
        calls, tokens = calls + 1, tokens + verdict.tokens
    if verdicts or day in memory.judge_usage:
        memory.judge_usage = {day: [calls, tokens]}
    kept = sorted(memory.verdicts.items(), key=lambda kv: (kv[1].at, kv[0]))[-VERDICTS_KEPT:]
    memory.verdicts = dict(kept)
    memory.judge_note = note
