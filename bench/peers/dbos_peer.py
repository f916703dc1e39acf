"""DBOS's side of `make bench-peers`: a workflow that calls one step n times, its system
database on SQLite. See peer_common.py for the commands.

A resumed run is what DBOS does at launch: it recovers the workflows its executor left
pending, and the step that was running when the process died runs again.
"""

from __future__ import annotations

import peer_common
from dbos import DBOS, SetWorkflowID

workspace = ""


@DBOS.step()
def step(index: int) -> int:
    return peer_common.read_step(workspace, index)


@DBOS.workflow()
def steps(n: int) -> int:
    done = 0
    for index in range(n):
        done = step(index)
    return done


def setup(db: str, workspace_dir: str) -> None:
    global workspace
    workspace = workspace_dir
    DBOS(config={"name": "perdure-bench-peer", "system_database_url": f"sqlite:///{db}", "log_level": "WARNING"})
    DBOS.launch()


def run(run_id: str, n: int) -> None:
    with SetWorkflowID(run_id):
        DBOS.start_workflow(steps, n).get_result()


def resume(run_id: str) -> bool:
    # Launch already started recovering it; wait for that run's result.
    if DBOS.get_workflow_status(run_id) is None:
        return False
    DBOS.retrieve_workflow(run_id).get_result()
    return True


if __name__ == "__main__":
    peer_common.main(run, resume, setup)
