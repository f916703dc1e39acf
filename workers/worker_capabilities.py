"""What a worker offers, computed on the worker itself: its model profiles, its tools (the
user's own among them, with their declarations as data), the MCP servers its config.toml
names and the ids of its payload keys.

`CapabilitiesActivities.offer()` is what the worker publishes while it runs
(workers/offer_publisher.py, read by `perdure profiles` and the checks of `perdure start`
without starting anything), so the CLI sees what a running worker would resolve (its
config.toml, reloaded when it changes, and its environment), not a file on the CLI's
machine. Names only: never a key, nor the name of the variable that holds one.

Also owns the `perdure.capabilities` activity and `PerdureCapabilities`, the one-activity
workflow the CLI started per question before offers were published: still registered so a
CLI of that version, talking to this worker, gets its answer.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    # Pure data and the profile table; the workflow only names the activity.
    from perdure.activities.models.profiles import ModelConfig, UnknownModelProfile
    from perdure.activities.tools.catalogue import TOOL_SPECS
    from perdure.workflows.offers.worker_offers import CapabilitiesResult, ProfileOffer
    from perdure.workflows.shared.user_tools import UserTool

CAPABILITIES_ACTIVITY = "perdure.capabilities"
CAPABILITIES_WORKFLOW = "PerdureCapabilities"

__all__ = ["CapabilitiesResult", "ProfileOffer"]  # defined with the offers workflow; part of these contracts


class CapabilitiesInput(BaseModel):
    pass


class CapabilitiesActivities:
    """Register with a Worker as `activities=[CapabilitiesActivities(config).capabilities]`."""

    def __init__(
        self,
        config: ModelConfig,
        mcp_servers: list[str] | None = None,
        payload_keys: list[str] | None = None,
        user_tools: list[UserTool] | None = None,
    ) -> None:
        self.config = config
        self.mcp_servers = mcp_servers or []
        self.payload_keys = payload_keys
        self.user_tools = user_tools or []

    def offer(self) -> CapabilitiesResult:
        """What this worker offers now (a changed config file is read again first)."""
        try:
            default = self.config.resolve("default").name  # reloads a changed config file first
        except UnknownModelProfile as err:
            default = f"none ({err})"
        profiles = [
            ProfileOffer(
                name=p.name,
                provider=p.provider,
                model=p.model,
                priced=bool(p.price_input_per_mtok or p.price_output_per_mtok),
            )
            for p in sorted(self.config.profiles.values(), key=lambda p: p.name)
        ]
        return CapabilitiesResult(
            profiles=profiles,
            default_profile=default,
            tools=sorted([*TOOL_SPECS, *(t.name for t in self.user_tools)]),
            user_tools=self.user_tools,
            mcp_servers=self.mcp_servers,
            config_problem=self.config.problem,
            payload_keys=self.payload_keys,
        )

    @activity.defn(name=CAPABILITIES_ACTIVITY)
    async def capabilities(self, input: CapabilitiesInput) -> CapabilitiesResult:
        return self.offer()


@workflow.defn(name=CAPABILITIES_WORKFLOW)
class CapabilitiesWorkflow:
    """One activity on this workflow's task queue, so it runs on a worker that also runs goals."""

    @workflow.run
    async def run(self, input: CapabilitiesInput) -> CapabilitiesResult:
        return await workflow.execute_activity(
            CAPABILITIES_ACTIVITY,
            input,
            result_type=CapabilitiesResult,
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(maximum_attempts=2),
            summary="capabilities · the model profiles and tools this worker offers",
        )
