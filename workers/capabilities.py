"""What a worker offers, asked of the worker itself: its model profiles and its tools.

Owns the `perdure.capabilities` activity and `PerdureCapabilities`, a workflow of that
one activity, both registered by the orchestrator worker on its task queue. The CLI
(starters/capabilities.py) starts the workflow and waits a few seconds for the answer, so
`perdure profiles` and the checks of `perdure start` see what a running worker would
resolve (its config.toml, reloaded when it changes, and its environment), not a file on
the CLI's machine. The activity reports profile names, providers and models only: never
a key, nor the name of the variable that holds one.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    # Pure data and the profile table; the workflow only names the activity.
    from activities.models.config import ModelConfig, UnknownModelProfile
    from workflows.tool_specs import TOOL_SPECS

CAPABILITIES_ACTIVITY = "perdure.capabilities"
CAPABILITIES_WORKFLOW = "PerdureCapabilities"


class ProfileOffer(BaseModel):
    name: str
    provider: str
    model: str
    priced: bool = Field(description="Whether the profile has a non-zero price per token.")


class CapabilitiesInput(BaseModel):
    pass


class CapabilitiesResult(BaseModel):
    profiles: list[ProfileOffer]
    default_profile: str = Field(description="The profile `default` means on this worker.")
    tools: list[str]
    mcp_servers: list[str] = Field(
        default_factory=list, description="The MCP servers its config.toml names: their tools are mcp__SERVER__TOOL."
    )
    config_problem: str | None = Field(default=None, description="Why the worker's config file is not in use.")


class CapabilitiesActivities:
    """Register with a Worker as `activities=[CapabilitiesActivities(config).capabilities]`."""

    def __init__(self, config: ModelConfig, mcp_servers: list[str] | None = None) -> None:
        self.config = config
        self.mcp_servers = mcp_servers or []

    @activity.defn(name=CAPABILITIES_ACTIVITY)
    async def capabilities(self, input: CapabilitiesInput) -> CapabilitiesResult:
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
            tools=sorted(TOOL_SPECS),
            mcp_servers=self.mcp_servers,
            config_problem=self.config.problem,
        )


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
