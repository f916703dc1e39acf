"""What a goal shows about itself: the `progress` query's snapshot and the
markdown the Temporal UI shows as the workflow's current details. Pure.

The goal works out the figures that need its clock or its index (percent done,
budget fractions, ETA, active time) and hands them in; everything else is read off the state.
"""

from __future__ import annotations

from perdure.workflows.goal.contracts.abort_contracts import AbortProgress
from perdure.workflows.goal.contracts.goal_contracts import NodeView, ProgressSnapshot, QuestionView
from perdure.workflows.goal.contracts.state import GoalState, Node
from perdure.workflows.goal.rules import frontier
from perdure.workflows.goal.rules.eta import Eta
from perdure.workflows.goal.rules.node_index import NodeIndex
from perdure.workflows.goal.rules.question_deadline_rules import deadline_line, report_note
from perdure.workflows.goal.rules.questions import done_so_far
from perdure.workflows.goal.rules.risk_order import ORDER_KEYS
from perdure.workflows.quota.quota_workflow import QUOTA_KEY
from perdure.workflows.shared.statuses import ENDED_PHASES, IN_FLIGHT

GOAL_SHOWN = 300
# Of a large goal's steps in each group (ready, settled last, failed), the most a snapshot
# lists, and of its steps in flight: `perdure status` prints a row for each.
LISTED_EACH = 25
IN_FLIGHT_LISTED = 100
OBJECTS_SHOWN = 50
EXPIRED_SHOWN = 10
# The latest messages refused at the door a snapshot carries (`perdure status` prints them).
REFUSALS_SHOWN = 3


def progress_snapshot(
    state: GoalState,
    goal_id: str,
    percent: int,
    fractions: dict[str, float],
    eta: Eta | None,
    active_seconds: float = 0.0,
    abort: AbortProgress | None = None,
    index: NodeIndex | None = None,
) -> ProgressSnapshot:
    """`abort`: what an abort has done so far (workflows/goal/rules/abort_view.py); while it is
    under way the phase says "aborting". `index`: the goal's node index, which a large goal's
    snapshot counts from and lists its frontier by (rules/frontier.py)."""
    nodes, unlisted = listed_nodes(state, index)
    if unlisted or (index is not None and index.total != len(state.nodes)):
        counts = index.counts() if index is not None else {}
    else:
        counts = {}
        for node in nodes:
            counts[node.status] = counts.get(node.status, 0) + 1
    open_questions = state.open_questions()
    return ProgressSnapshot(
        goal_id=goal_id,
        phase="aborting" if abort is not None and state.phase not in ENDED_PHASES else state.phase,
        plan_version=len(state.plan_versions),
        counts=counts,
        unlisted=unlisted,
        running=[n.name for n in nodes if n.status == "running"],
        percent_done=percent,
        tokens=state.ledger.tokens,
        cost_usd=state.ledger.cost_usd,
        tool_cost_usd=state.ledger.tool_cost_usd,
        model_calls=state.ledger.model_calls,
        active_seconds=round(active_seconds, 1),
        deadline=state.spec.budget.deadline,
        failed_attempts=state.ledger.failed_attempts,
        lost_attempts=state.ledger.lost_attempts,
        estimated_cost_usd=state.ledger.estimated_cost_usd,
        tool_calls=state.ledger.tool_calls,
        refused=state.refused[-REFUSALS_SHOWN:],
        refused_count=len(state.refused),
        nodes=[node_view(n) for n in nodes],
        earlier=[node_view(r.node, r.plan_version) for r in state.retired_nodes],
        results={n.name: n.output.digest for n in nodes if n.output is not None},
        report=state.result.report if state.result else None,
        failure=state.failure,
        parked=state.pause.mode == "parked",
        pause_reason=pause_reason(state),
        premises=state.premises,
        questions=[
            QuestionView(
                id=q.id,
                topic=q.topic,
                asked_at=q.asked_at,
                title=q.title,
                done=done,
                stuck=q.stuck,
                options=[o.model_dump() for o in q.options],
                recommendation=q.recommendation,
                deadline_at=q.deadline_at,
                remind_at=q.remind_at,
                reminded_at=q.reminded_at,
                on_expiry=q.on_expiry,
                expired_at=q.expired_at,
                ahead=q.ahead,
            )
            for q, done in zip(open_questions, done_so_far(state, open_questions), strict=True)
        ],
        pending_messages=sum(1 for e in state.inbox if e.status == "pending"),
        budget=fractions,
        degraded=any(n.degraded for n in nodes if n.status in IN_FLIGHT),
        eta=eta.text if eta else None,
        eta_confidence=eta.confidence if eta else None,
        conclusions=[
            f"{n.name}: {n.preview}" for n in nodes if n.status == "succeeded" and n.kind != "tool" and n.preview
        ][-5:],
        gate_log=state.gate_log[-10:],
        started_at=state.started_at,
        runs=state.runs,
        last_progress_at=state.last_progress_at or state.started_at,
        stall_after_s=state.spec.stall_after_s,
        stall_rungs={n.name: n.stall.rung for n in nodes if n.stall.rung},
        park_expires_at=state.pause.expires_at if state.pause.mode == "parked" else None,
        oldest_question_at=min((q.asked_at for q in open_questions), default=None),
        expired_questions=[report_note(q) for q in state.questions if q.expired_at is not None][-EXPIRED_SHOWN:],
        devices=device_lines(state),
        waiting_for_devices=waits_for_devices(state),
        hosts=sorted(name for name, presence in state.devices.items() if presence.workspaces),
        forked_from=state.spec.forked_from,
        own_calls=state.ledger.own_calls,
        goal=state.spec.goal[:GOAL_SHOWN],
        workspace=state.spec.workspace,
        objects=owned_objects(state),
        abort=abort,
    )


def listed_nodes(state: GoalState, index: NodeIndex | None) -> tuple[list[Node], int]:
    """The nodes a snapshot lists, and how many steps it leaves out. A goal of fewer than
    FRONTIER_STEPS steps lists every node; a large one its frontier: its steps in flight (at
    most IN_FLIGHT_LISTED), the next ready ones, and the latest that settled (at most
    LISTED_EACH of each, and of its failed ones), in plan order; its counts have the rest."""
    nodes = list(state.nodes.values())
    if index is None or state.plan is None or not frontier.is_large(index.total):
        return nodes, 0
    ready = []
    for name in index.ready()[:LISTED_EACH]:
        step = state.plan.step(name)
        ready.append(state.nodes.get(name) or Node(name=name, kind=step.kind, needs=list(step.needs)))
    picked = {n.name: n for n in [n for n in nodes if n.status in IN_FLIGHT][:IN_FLIGHT_LISTED]}
    picked.update((n.name, n) for n in [n for n in nodes if n.status in ("failed", "abandoned")][:LISTED_EACH])
    picked.update((n.name, n) for n in [n for n in nodes if n.status == "succeeded"][-LISTED_EACH:])
    picked.update((n.name, n) for n in ready)
    listed = sorted(picked.values(), key=lambda n: index.position(n.name))
    return listed, index.total - len(listed)


def owned_objects(state: GoalState) -> list[str]:
    """What a message may name to mean this goal: the workspace files it wrote or its plan
    writes, and the digests of what it made (the router binds messages by them)."""
    found: list[str] = []

    def add(name: str | None) -> None:
        if name and name not in found and len(found) < OBJECTS_SHOWN:
            found.append(name)

    for step in state.plan.steps if state.plan else []:
        args = getattr(step, "args", None)
        if getattr(step, "tool", None) == "write_file" and isinstance(args, dict):
            add(str(args.get("path") or "").removeprefix("./"))
    for node in state.nodes.values():
        for fingerprint in node.fingerprints:
            if fingerprint.kind == "wrote":
                add(fingerprint.source.partition(":")[2].removeprefix("./"))
    for node in state.nodes.values():
        add(node.output.digest if node.output else None)
    return found


def node_view(node: Node, plan_version: int | None = None) -> NodeView:
    return NodeView(
        name=node.name,
        kind=node.kind,
        status=node.status,
        key=node.key,
        preview=node.preview,
        error=node.error,
        placements={tool: why for tool, why in node.placements.items() if tool not in (*ORDER_KEYS, QUOTA_KEY)},
        compactions=len(node.compactions),
        plan_version=plan_version,
        waiting_for_device=_device_waited_for(node),
        needs=list(node.needs),
        tokens=node.tokens,
        cost_usd=node.cost_usd,
        # A quota wait holds the step back too: shown where risk order's holds are (perdure status).
        held_back=[node.placements[key] for key in (*ORDER_KEYS, QUOTA_KEY) if key in node.placements],
        child=node.child,
        quota=node.placements.get(QUOTA_KEY),
        read_at=min((p.at for p in node.fingerprints if p.kind == "read"), default=None),
    )


def _device_waited_for(node: Node) -> str | None:
    waiting = node.waiting_on or ""
    return waiting.removeprefix("device:") if node.status == "offline" and waiting.startswith("device:") else None


def waits_for_devices(state: GoalState) -> dict[str, str]:
    """Node -> the device it waits for, of the nodes offline now."""
    nodes = state.nodes
    return {n: w.device for n, w in state.device_waits.items() if n in nodes and nodes[n].status == "offline"}


def _is_host(state: GoalState, name: str) -> bool:
    presence = state.devices.get(name)
    return presence is not None and bool(presence.workspaces)


def device_lines(state: GoalState) -> dict[str, str]:
    """Each device the goal uses, as the registry last said: online or offline, since when."""
    lines = {}
    for name, presence in sorted(state.devices.items()):
        if not presence.known:
            lines[name] = "never seen"
            continue
        since = f" since {presence.since:%Y-%m-%d %H:%M:%S} UTC" if presence.since else ""
        lines[name] = f"{'online' if presence.online else 'offline'}{since} · session {presence.generation}"
    return lines


def details_markdown(
    state: GoalState, index: NodeIndex, percent: int, fractions: dict[str, float], eta: Eta | None
) -> str:
    """The UI's current details: a few lines, from the index, never a scan of every node."""
    running = index.names(("running",))
    lines = [
        f"**{state.phase}** · {percent}% · {index.count(('succeeded',))}/{index.total} nodes succeeded",
        f"running: {', '.join(running) or '—'}",
        f"tokens {state.ledger.tokens} · ${state.ledger.cost_usd:.4f} · "
        f"{state.ledger.model_calls} model calls · {state.ledger.tool_calls} tool calls",
    ]
    if fractions:
        lines.append("budget: " + " · ".join(f"{k} {v:.0%}" for k, v in fractions.items()))
    if eta:
        lines.append(f"ETA: {eta.text}")
    if state.pause.mode == "parked":
        lines.append(f"parked: {state.pause.reason}")
    waiting = sorted(set(waits_for_devices(state).values()))
    for kind, names in (
        ("device", [n for n in waiting if not _is_host(state, n)]),
        ("host", [n for n in waiting if _is_host(state, n)]),
    ):
        if names:
            lines.append(f"waiting for {kind} {', '.join(names)} (offline)")
    for question in state.open_questions():
        expires = f" · {deadline_line(question)}" if question.deadline_at is not None else ""
        lines.append(f"**needs you** ({question.id}): {question.title}{expires}")
    if state.failure:
        lines.append(f"failure: {state.failure}")
    return "\n\n".join(lines)


def pause_reason(state: GoalState) -> str | None:
    """Why the goal is parked, and for a park that ends by itself, what it waits for."""
    pause = state.pause
    if pause.condition is None or pause.reason is None:
        return pause.reason
    return f"{pause.reason} ({pause.condition.describe()})"
