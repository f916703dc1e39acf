"""Quotas as config.toml declares them, and what a quota wait leaves on a node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from perdure.activities.models.profiles import ModelConfigInvalid, load_model_config
from perdure.workflows.goal.contracts.state import Node
from perdure.workflows.goal.rules.estimates import own_seconds
from perdure.workflows.quota.quota_workflow import QUOTA_KEY, slot_text, waited_seconds, waited_text


def test_a_quotas_table_declares_a_resource_that_profiles_draw_on(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        "[quotas.openai-key]\nrequests_per_minute = 10\ntokens_per_minute = 40000\n\n"
        '[profiles.fast]\nprovider = "openai"\nmodel = "gpt-4o-mini"\nquota = "openai-key"\n'
    )
    config = load_model_config(path)
    assert config.quotas["openai-key"].requests_per_minute == 10
    assert config.quotas["openai-key"].tokens_per_minute == 40000
    assert config.profiles["fast"].quota == "openai-key"
    assert config.profiles["openai"].quota is None


def test_a_quota_key_that_is_not_enforced_is_refused_not_ignored(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[quotas.openai]\nburst = 4\n")
    with pytest.raises(ModelConfigInvalid, match=r"\[quotas.openai\] is invalid"):
        load_model_config(path)


def test_a_nodes_quota_wait_is_left_out_of_its_own_duration():
    start = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    node = Node(name="n", kind="llm", started_at=start, finished_at=start + timedelta(seconds=50))
    assert own_seconds(node) == 50
    node.placements[QUOTA_KEY] = slot_text("openai", start + timedelta(seconds=30))
    assert node.placements[QUOTA_KEY] == "waiting for quota openai (next slot 12:00:30)"
    assert waited_seconds(node.placements) == 0
    node.placements[QUOTA_KEY] = waited_text("openai", 30.0, 3)
    assert node.placements[QUOTA_KEY] == "waited 30.0 s for quota openai, serialized behind 3 other calls"
    assert own_seconds(node) == 20
