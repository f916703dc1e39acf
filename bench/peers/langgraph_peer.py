"""LangGraph's side of `make bench-peers`: one node that runs a step and loops back to
itself n times, checkpointed by the SQLite saver after every step (durability "sync",
the write finishes before the next step starts). See peer_common.py for the commands.

A resumed run is `invoke(None)` on the same thread: LangGraph starts again from the
last checkpoint, so the step that was running when the process died runs again.
"""

from __future__ import annotations

import sqlite3
from typing import TypedDict

import peer_common
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph


class Count(TypedDict):
    i: int
    n: int


graph = None
workspace = ""


def setup(db: str, workspace_dir: str) -> None:
    global graph, workspace
    workspace = workspace_dir

    def step(state: Count) -> dict:
        return {"i": peer_common.read_step(workspace, state["i"])}

    builder = StateGraph(Count)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: END if s["i"] >= s["n"] else "step")
    saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
    graph = builder.compile(checkpointer=saver)


def config(run_id: str, n: int = 0) -> dict:
    # Every step is one superstep; the default recursion limit (25) would stop a long run.
    return {"configurable": {"thread_id": run_id}, "recursion_limit": n + 10 if n else 100_000}


def run(run_id: str, n: int) -> None:
    graph.invoke({"i": 0, "n": n}, config(run_id, n), durability="sync")


def resume(run_id: str) -> bool:
    if not graph.get_state(config(run_id)).next:
        return False
    graph.invoke(None, config(run_id), durability="sync")
    return True


if __name__ == "__main__":
    peer_common.main(run, resume, setup)
