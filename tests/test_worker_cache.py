"""How many goal runs an orchestrator worker keeps in memory (its sticky workflow cache):
the SDK's 1,000 unless PERDURE_WORKFLOW_CACHE says otherwise (docs/operations/benchmarks.md: what a
cached goal costs, and what a goal out of the cache costs on its next task)."""

from __future__ import annotations

import pytest

from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.mcp.mcp_calls import McpServers
from perdure.activities.models.profiles import ModelConfig
from perdure.runtime import settings
from perdure.workers.orchestrator import build_worker


def cached_runs(env, task_queue: str, tmp_path) -> int:
    worker = build_worker(
        env.client,
        task_queue=task_queue,
        store=DiskArtifactStore(tmp_path / "artifacts"),
        model_config=ModelConfig(profiles={}),
        mcp_servers=McpServers({}),
    )
    return worker.config()["max_cached_workflows"]


async def test_a_worker_keeps_a_thousand_runs_unless_told_otherwise(env, task_queue, tmp_path, monkeypatch):
    monkeypatch.delenv(settings.WORKFLOW_CACHE_ENV, raising=False)
    assert cached_runs(env, task_queue + "-default", tmp_path) == 1000
    monkeypatch.setenv(settings.WORKFLOW_CACHE_ENV, "250")
    assert cached_runs(env, task_queue + "-set", tmp_path) == 250


@pytest.mark.parametrize("value", ["many", "-5", "2.5"])
def test_a_cache_size_that_is_not_a_whole_number_is_refused(monkeypatch, value):
    monkeypatch.setenv(settings.WORKFLOW_CACHE_ENV, value)
    with pytest.raises(ValueError, match="PERDURE_WORKFLOW_CACHE must be a whole number"):
        settings.workflow_cache()
