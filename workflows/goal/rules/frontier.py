"""Which of a large goal's steps its frontier still needs. Pure.

A goal whose plan has at least FRONTIER_STEPS steps keeps in its node table only the
steps it has touched and still needs: a step is given a node when it is about to start
(or a rule changes its status), and a settled step leaves the table for the artifact
store (workflows/goal/past.py) once no step still to start needs it. The rest of the goal
knows such a step only by its plan position (a bit in PastLog.stored) and the counts. A
goal of fewer steps keeps every node, as it always did.

What must not be stored: a step whose output or status a step still to start reads
(a dependant that is pending), a step a person is asked about, or one whose effect is
uncertain (its outcome is still to be learnt).
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator
from itertools import compress

from perdure.workflows.goal.contracts.state import GoalState, Node

# Plans of at least this many steps run with a frontier (see above).
FRONTIER_STEPS = 1_000
# Nodes per stored chunk: about 1 KB each, so a chunk is about 2 MB of JSON.
PAST_CHUNK_NODES = 2_000
# Plan steps per stored chunk: validated in one workflow task when a run loads its plan.
PLAN_CHUNK_STEPS = 10_000
# A large goal whose last run settled at least this many steps reports in a run of its own
# (workflows/goal/past.py): a query on the finished goal replays only that one.
LAST_RUN_AFTER = 2 * FRONTIER_STEPS
# Statuses a stored node may have: settled, and nothing more to learn of it.
STORABLE = frozenset({"succeeded", "failed", "abandoned", "invalidated"})


def is_large(steps: int) -> bool:
    return steps >= FRONTIER_STEPS


def storable(
    node: Node,
    dependants: Iterable[str],
    status_of: Callable[[str], str],
    held: Collection[str],
) -> bool:
    """Whether `node` may leave the node table: settled, no agent loop or wait left on it,
    not named by a question or a device wait (`held`), and no dependant still to start."""
    if node.status not in STORABLE or node.agent is not None or node.waiting_on or node.name in held:
        return False
    return all(status_of(d) != "pending" for d in dependants)


def held_names(state: GoalState) -> set[str]:
    """Steps the goal's open business names: questions not yet closed, device waits, subgoals."""
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
