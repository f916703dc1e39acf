"""Stores and reads the chunks a large goal keeps by reference (workflows/goal/past.py
decides when; workflows/goal/contracts/past_chunks.py says what a chunk holds): its settled
nodes, and its plan's steps.

A chunk is content-addressed JSON: written again after a retry or a replay, it is the same
artifact. These activities decide nothing and read no clock.
"""

from __future__ import annotations

import asyncio

from temporalio import activity

from perdure.activities.artifacts import ArtifactStore
from perdure.workflows.goal import plan_cache
from perdure.workflows.goal.contracts import past_chunks as chunks
from perdure.workflows.shared.contracts import ArtifactRef


class PastActivities:
    def __init__(self, store: ArtifactStore) -> None:
        self._store = store

    def activities(self) -> list:
        return [self.write_nodes, self.read_nodes, self.write_plan, self.read_plan]

    @activity.defn(name=chunks.WRITE_PAST)
    async def write_nodes(self, input: chunks.WritePastInput) -> ArtifactRef:
        return await self._store.aput_text(chunks.PastChunk(nodes=input.nodes).model_dump_json(), "application/json")

    @activity.defn(name=chunks.READ_PAST)
    async def read_nodes(self, input: chunks.ReadChunkInput) -> chunks.PastChunk:
        return chunks.PastChunk.model_validate_json(await self._store.aget_text(input.ref))

    @activity.defn(name=chunks.WRITE_PLAN)
    async def write_plan(self, input: chunks.WritePlanInput) -> ArtifactRef:
        return await self._store.aput_text(chunks.PlanChunk(steps=input.steps).model_dump_json(), "application/json")

    @activity.defn(name=chunks.READ_PLAN)
    async def read_plan(self, input: chunks.ReadChunkInput) -> str:
        """The chunk's JSON text, validated here for the goal this worker runs (plan_cache.py):
        a run replayed on another worker validates the text itself."""
        text = await self._store.aget_text(input.ref)
        await asyncio.to_thread(plan_cache.validated, input.ref, text)
        return text
