"""Stores the older entries of a goal's decision log as one chunk in the artifact store
(workflows/goal/decision_log.py decides when; workflows/goal/contracts/decision_contracts.py
says what a chunk holds).

A chunk is the entries' JSON array, content-addressed: written again after a retry or a
replay, it is the same artifact. It decides nothing and reads no clock.
"""

from __future__ import annotations

from temporalio import activity

from perdure.activities.artifacts import ArtifactStore
from perdure.workflows.goal.contracts.decision_contracts import WriteDecisionsInput
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.shared.contracts import ArtifactRef


class DecisionActivities:
    def __init__(self, store: ArtifactStore) -> None:
        self._store = store

    def activities(self) -> list:
        return [self.write_chunk]

    @activity.defn(name=Activities.WRITE_DECISIONS)
    async def write_chunk(self, input: WriteDecisionsInput) -> ArtifactRef:
        return await self._store.aput_json([entry.model_dump(mode="json") for entry in input.entries])
