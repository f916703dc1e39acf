"""perdure.runtime.plugin: a client connected with PerdurePlugin, the worker built on it and a
Replayer given it read and write payloads the same way (pydantic values, large ones
through the payload store), shown by a round trip through the session's dev server.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Replayer, Worker

from perdure.runtime import converter
from perdure.runtime.plugin import PLUGIN_NAME, PerdurePlugin


class Parcel(BaseModel):
    text: str
    hops: list[str] = []


@activity.defn(name="test.runtime_plugin.forward")
async def forward(parcel: Parcel) -> Parcel:
    return Parcel(text=parcel.text, hops=[*parcel.hops, "activity"])


@workflow.defn(name="test.runtime_plugin.Courier")
class Courier:
    @workflow.run
    async def run(self, parcel: Parcel) -> Parcel:
        forwarded = await workflow.execute_activity(forward, parcel, start_to_close_timeout=timedelta(seconds=30))
        return Parcel(text=forwarded.text, hops=[*forwarded.hops, "workflow"])


async def test_client_worker_and_replayer_share_the_plugins_converter(env, task_queue, monkeypatch, tmp_path: Path):
    # Every payload of 1 KiB or more goes to this store: the worker can only run the
    # workflow if it reads and writes the store exactly as the client does.
    store = tmp_path / "payloads"
    monkeypatch.setenv(converter.STORE_ENV, f"disk:{store}")
    monkeypatch.setenv(converter.THRESHOLD_ENV, "1024")
    plugin = PerdurePlugin()
    client = await Client.connect(
        env.client.service_client.config.target_host, namespace=env.client.namespace, plugins=[plugin]
    )
    assert client.data_converter is plugin.data_converter

    worker = Worker(client, task_queue=task_queue, workflows=[Courier], activities=[forward])
    assert worker.client.data_converter is plugin.data_converter
    text = "parcel " * 400
    async with worker:
        result = await client.execute_workflow(
            Courier.run, Parcel(text=text), id=f"courier-{task_queue}", task_queue=task_queue
        )
    assert result == Parcel(text=text, hops=["activity", "workflow"])
    # Input, activity input and result, workflow result: each offloaded, none inline in history.
    assert len(list(store.rglob("sha256/*/*"))) >= 3
    history = await client.get_workflow_handle(f"courier-{task_queue}").fetch_history()
    assert not any(text.encode() in event.SerializeToString() for event in history.events)

    replayer = Replayer(workflows=[Courier], plugins=[PerdurePlugin()])
    assert (await replayer.replay_workflow(history, raise_on_replay_failure=False)).replay_failure is None
    assert [p.name() for p in client.config()["plugins"]] == [PLUGIN_NAME]
