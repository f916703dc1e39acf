"""Which of a large goal's steps its frontier still needs. Pure.

A goal whose plan has at least FRONTIER_STEPS steps keeps in its node table only the
steps it has touched and still needs: a step is given a node when it is about to start
(or a rule changes its status), and a settled step leaves the table for the artifact
store (workflows/goal/past.py) once no step still to start needs it. The rest of the goal
knows such a step only by its plan position (a bit in PastLog.stored) and the counts. A
goal of fewer steps keeps every node, as it always did.

What must not be stored: a step whose output or status a step not settled yet reads (a
dependant that is pending, or running, waiting, parked, offline or uncertain: it reads its
inputs again on each turn or attempt), a step a person is asked about, one whose effect is
uncertain (its outcome is still to be learnt), or one that read or wrote a workspace file
while a write step downstream of it has not settled (that write is checked against the
file versions its upstream steps saw: workflows/goal/tool_runner.py versions_seen).
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator
from itertools import compress

from perdure.activities.tools.catalogue import VERSIONED_WRITES
from perdure.workflows.goal.contracts.plan import Plan, PlanStep
from perdure.workflows.goal.contracts.state import GoalState, Node
from perdure.workflows.goal.rules.node_index import plan_graph

# Plans of at least this many steps run with a frontier (see above).
FRONTIER_STEPS = 1_000
# Nodes per stored chunk: about 1 KB each (a read's), so a chunk is about 500 KB of JSON, well
# under Temporal's 2 MB payload (a chunk read back is a local activity's recorded result).
PAST_CHUNK_NODES = 500
# Plan steps per stored chunk: validated in one workflow task when a run loads its plan, and
# recorded as a local activity's result (a few hundred KB: well under Temporal's 2 MB payload).
PLAN_CHUNK_STEPS = 2_000
# A large goal whose last run settled at least this many steps reports in a run of its own
# (workflows/goal/past.py): a query on the finished goal replays only that one.
LAST_RUN_AFTER = 2 * FRONTIER_STEPS
# Statuses a stored node may have: settled, and nothing more to learn of it.
STORABLE = frozenset({"succeeded", "failed", "abandoned", "invalidated"})
# A stored step's dependants: each settled, or stored itself (rules/node_index.py status_of).
SETTLED_OR_STORED = STORABLE | {"stored"}
FILE_SOURCE = "file:"


def is_large(steps: int) -> bool:
    return steps >= FRONTIER_STEPS


def storable(
    node: Node,
    dependants: Iterable[str],
    status_of: Callable[[str], str],
    held: Collection[str],
) -> bool:
    """Whether `node` may leave the node table: settled, no agent loop or wait left on it,
    not named by a question or a device wait (`held`), and every dependant settled (one in
    flight reads this node's output again when it runs: workflows/goal/context.py inputs)."""
    if node.status not in STORABLE or node.agent is not None or node.waiting_on or node.name in held:
        return False
    return all(status_of(d) in SETTLED_OR_STORED for d in dependants)


def saw_files(node: Node) -> bool:
    """Whether `node` read or wrote a workspace file: a later write may be based on it."""
    return any(p.source.startswith(FILE_SOURCE) for p in node.fingerprints)


def write_steps(plan: Plan) -> frozenset[str]:
    """The steps that may make a versioned write (a write_file step, an agent offered
    write_file), kept beside the plan's fields."""
    cached = plan.__dict__.get(_WRITES)
    if cached is not None and cached[0] is plan.steps and cached[1] == len(plan.steps):
        return cached[2]
    found = frozenset(s.name for s in plan.steps if VERSIONED_WRITES.intersection(_tools_of(s)))
    plan.__dict__[_WRITES] = (plan.steps, len(plan.steps), found)
    return found


def _tools_of(step: PlanStep) -> tuple[str, ...]:
    fields = type(step).model_fields  # a missed attribute lookup on a model is slow: 100,000 steps
    return (step.tool,) if "tool" in fields else tuple(step.tools or ()) if "tools" in fields else ()


_WRITES = "_write_steps"


def upstream_of_unsettled_writes(plan: Plan, status_of: Callable[[str], str]) -> set[str]:
    """Every step a write step not settled yet builds on, directly or not: what such a
    write is checked against is the file versions these saw (workflows/goal/tool_runner.py
    versions_seen), so one that saw a file stays in the node table until the write settles."""
    needs = plan_graph(plan).needs
    todo = [w for w in write_steps(plan) if status_of(w) not in SETTLED_OR_STORED]
    found: set[str] = set()
    while todo:
        for dep in needs[todo.pop()]:
            if dep not in found:
                found.add(dep)
                todo.append(dep)
    return found


def held_names(state: GoalState) -> set[str]:
    """Steps the goal's open business names: open questions (the steps they are about and
    those they hold back) and device waits and moves."""
    held = set(state.device_waits) | set(state.device_moves)
    for question in state.questions:
        if question.status == "open":
            held.update(question.nodes)
            held.update(question.hold)
    return held


# --- which plan steps are stored: a bitmap by plan position ---------------------------


def encode_bits(bits: bytearray) -> str:
    return base64.b64encode(zlib.compress(bytes(bits), 6)).decode("ascii") if any(bits) else ""


def decode_bits(text: str, size: int) -> bytearray:
    """The bitmap for a plan of `size` steps (bit i: step i)."""
    bits = bytearray(zlib.decompress(base64.b64decode(text))) if text else bytearray()
    need = (size + 7) // 8
    return bits[:need] + bytearray(max(0, need - len(bits)))


def marked(bits: bytearray, names: list[str]) -> Iterator[str]:
    """The names whose bits are set (bit i: names[i]), without a Python step per name."""
    flags = "".join(f"{byte:08b}"[::-1] for byte in bits)
    return compress(names, map(int, flags[: len(names)]))


def set_bit(bits: bytearray, i: int) -> None:
    bits[i >> 3] |= 1 << (i & 7)
