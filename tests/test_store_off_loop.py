"""No activity blocks the worker's event loop on an artifact-store call. Every activity of
a worker shares one loop, which also sends their heartbeats: a store call made on it (a
round trip to an object store on a slow link, up to boto3's 30 s read timeout) would
stop every other activity's heartbeats, and the server would time out and retry them (a
model call, paid again). Checked from outside: a real model activity reads and writes
the S3 store through a link that holds each request 2 s, beside an activity that must
heartbeat every 2 s on the same worker; the server's history says whether it timed out.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import warnings
from datetime import timedelta

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.common import RetryPolicy
from temporalio.testing import ActivityEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from perdure.activities.artifacts import StoreCallOnLoop
from perdure.activities.artifacts.s3_store import S3ArtifactStore
from perdure.activities.models.model_activities import ModelActivities
from perdure.activities.models.profiles import ModelConfig, ModelProfile
from perdure.runtime.s3_client import S3Location
from perdure.testing.s3_server import S3Server
from perdure.testing.slow_link import SlowLink
from perdure.workflows.goal.contracts.goal_contracts import Activities, GenerateInput, GenerateResult, ModelContext

LINK_DELAY_S = 2.0
HEARTBEAT_TIMEOUT = timedelta(seconds=2)
BEAT_FOR_S = 9.0


@activity.defn(name="test.store_off_loop.beat")
async def beat(seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        activity.heartbeat()
        await asyncio.sleep(0.2)
    return "beat to the end"


@workflow.defn(name="test.store_off_loop.Beside")
class Beside:
    """A model step and a heartbeating activity at once, on one worker."""

    @workflow.run
    async def run(self, step: GenerateInput) -> str:
        once = RetryPolicy(maximum_attempts=1)
        generated = workflow.execute_activity(
            Activities.GENERATE,
            step,
            result_type=GenerateResult,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=once,
        )
        beating = workflow.execute_activity(
            beat,
            BEAT_FOR_S,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=once,
        )
        done, beaten = await asyncio.gather(generated, beating, return_exceptions=True)
        if isinstance(done, BaseException):
            raise done
        return beaten if isinstance(beaten, str) else f"beat failed: {beaten.cause or beaten}"


@pytest.mark.slow
async def test_a_slow_object_store_does_not_stall_another_activity_s_heartbeats(
    env, task_queue, s3_server: S3Server, s3_artifacts: S3Location, scripted, monkeypatch
):
    step_input = S3ArtifactStore(s3_artifacts, None).put_text("the listing of the project, read before")
    link = SlowLink(s3_server.endpoint, LINK_DELAY_S).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", link.endpoint)  # the worker's client goes through the link
    server = scripted({"replies": [{"content": "The summary of the listing."}]})
    profile = ModelProfile(name="gpt", provider="openai", model="gpt-test", base_url=server.openai_base_url)
    models = ModelActivities(ModelConfig(profiles={"gpt": profile}), S3ArtifactStore(s3_artifacts, None))
    worker = Worker(
        env.client,
        task_queue=task_queue,
        workflows=[Beside],
        activities=[models.generate, beat],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    step = GenerateInput(
        context=ModelContext(profile="gpt", goal="Summarise."),
        step="sum",
        prompt="Summarise.",
        inputs={"look": step_input},
    )
    workflow_id = f"store-off-loop-{uuid.uuid4().hex[:8]}"
    try:
        async with worker:
            said = await env.client.execute_workflow(Beside.run, step, id=workflow_id, task_queue=task_queue)
    finally:
        link.stop()
    assert link.forwarded >= 3  # the input read, and the output's look and write, each held 2 s
    history = await env.client.get_workflow_handle(workflow_id).fetch_history()
    timed_out = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT]
    assert said == "beat to the end" and not timed_out, said


async def test_a_blocking_store_call_on_an_activity_s_loop_is_flagged(store):
    @activity.defn(name="test.store_off_loop.blocking")
    async def blocking() -> str:
        return store.put_text("written on the loop").digest

    @activity.defn(name="test.store_off_loop.threaded")
    async def threaded() -> str:
        return (await store.aput_text("written in a thread")).digest

    with pytest.warns(StoreCallOnLoop, match="artifact store put blocks the event loop of activity"):
        await ActivityEnvironment().run(blocking)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreCallOnLoop)
        assert store.has(await ActivityEnvironment().run(threaded))
        store.put_text("outside any activity: the CLI's reads, a test's setup")
