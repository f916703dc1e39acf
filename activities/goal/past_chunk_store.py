"""Stores and reads the chunks a large goal keeps by reference (workflows/goal/past.py
decides when; workflows/goal/contracts/past_chunks.py says what a chunk holds): its settled
nodes, and its plan's steps.

A chunk is content-addressed JSON: written again after a retry or a replay, it is the same
artifact. These activities decide nothing and read no clock. A chunk that is not in the
store, or no longer reads as one, fails its read for good (the goal retries later and then
parks, saying which chunk: workflows/goal/past.py); a store that cannot be reached is
retried.
"""

from __future__ import annotations

import asyncio

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from perdure.activities.artifacts import ArtifactCorrupt, ArtifactMissing, ArtifactStore, ObjectStoreUnavailable
from perdure.workflows.goal import plan_cache
from perdure.workflows.goal.contracts import past_chunks as chunks
from perdure.workflows.shared.contracts import ArtifactRef

CHUNK_MISSING = "ChunkMissing"
CHUNK_INVALID = "ChunkInvalid"
CHUNK_NOT_STORED = "ChunkNotStored"


class PastActivities:
    def __init__(self, store: ArtifactStore) -> None:
        self._store = store

    def activities(self) -> list:
        return [self.write_nodes, self.read_nodes, self.write_plan, self.read_plan]

    @activity.defn(name=chunks.WRITE_PAST)
    async def write_nodes(self, input: chunks.WritePastInput) -> ArtifactRef:
        return await self._write(chunks.PastChunk(nodes=input.nodes).model_dump_json())

    @activity.defn(name=chunks.READ_PAST)
    async def read_nodes(self, input: chunks.ReadChunkInput) -> chunks.PastChunk:
        text = await self._read(input.ref)
        try:
            return chunks.PastChunk.model_validate_json(text)
        except ValidationError as err:
            raise _invalid(input.ref, err) from None

    @activity.defn(name=chunks.WRITE_PLAN)
    async def write_plan(self, input: chunks.WritePlanInput) -> ArtifactRef:
        return await self._write(chunks.PlanChunk(steps=input.steps).model_dump_json())

    @activity.defn(name=chunks.READ_PLAN)
    async def read_plan(self, input: chunks.ReadChunkInput) -> chunks.ReadPlanResult:
        """The chunk's JSON text, validated here for the goal this worker runs (plan_cache.py):
        a run replayed on another worker validates the text itself."""
        text = await self._read(input.ref)
        try:
            await asyncio.to_thread(plan_cache.validated, input.ref, text)
        except ValidationError as err:
            raise _invalid(input.ref, err) from None
        return chunks.ReadPlanResult(text=text)

    async def _write(self, text: str) -> ArtifactRef:
        try:
            return await self._store.aput_text(text, "application/json")
        except (OSError, ObjectStoreUnavailable) as err:
            raise ApplicationError(
                f"the artifact store did not take the chunk: {err}", type=CHUNK_NOT_STORED, non_retryable=False
            ) from None

    async def _read(self, ref: ArtifactRef) -> str:
        try:
            return await self._store.aget_text(ref)
        except ArtifactMissing as err:
            raise ApplicationError(
                f"chunk {ref.digest} is not in the artifact store: {err}", type=CHUNK_MISSING, non_retryable=True
            ) from None
        except (ArtifactCorrupt, UnicodeDecodeError) as err:
            raise _invalid(ref, err) from None


def _invalid(ref: ArtifactRef, err: Exception) -> ApplicationError:
    said = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
    return ApplicationError(
        f"chunk {ref.digest} in the artifact store does not read as one: {said}", type=CHUNK_INVALID, non_retryable=True
    )
