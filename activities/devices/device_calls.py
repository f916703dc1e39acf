"""The worker's side of a device call: the device has no artifact store, so a worker
resolves the call's arguments before it is sent (templates filled in, a model's JSON
read) and keeps the output the device returns; and what devices exist, for plan checks.

Activities on the orchestrator's queue (run as local activities by the goal). The call
itself runs on the device (activities/devices/device_tools.py).
"""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.client import Client, WorkflowQueryFailedError, WorkflowQueryRejectedError
from temporalio.service import RPCError, RPCStatusCode

from perdure.activities.artifacts import ArtifactStore, preview
from perdure.activities.tools.run_tool import ToolActivities
from perdure.workflows.devices.device_contracts import (
    MAX_DEVICE_PAYLOAD,
    DeviceListing,
    DeviceListingResult,
    DeviceOutput,
    RegistryQueries,
    ResolvedCall,
    registry_id,
)
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.shared.canonical import canonical_json
from perdure.workflows.shared.contracts import ToolInput, ToolResult

LIST_TIMEOUT_S = 5.0


class DeviceCallActivities:
    def __init__(self, store: ArtifactStore, client: Client, tools: ToolActivities | None = None) -> None:
        self._store = store
        # The worker's tool activities (with the user tools it loads): a call is resolved by its tool's rules.
        self._tools = tools or ToolActivities(store)
        self._client = client

    def activities(self) -> list:
        return [self.resolve_call, self.store_output, self.list_devices]

    @activity.defn(name=Activities.RESOLVE_DEVICE_CALL)
    async def resolve_call(self, input: ToolInput) -> ResolvedCall:
        # Off the loop: a model's arguments and templates are read from the artifact store.
        args, error = await asyncio.to_thread(self._tools.resolved_arguments, input)
        if error is not None or args is None:
            return ResolvedCall(error=error or "no arguments")
        size = len(canonical_json(args).encode())
        if size > MAX_DEVICE_PAYLOAD:
            return ResolvedCall(
                error=f"the arguments of {input.tool} are {size} bytes; a device call carries at most "
                f"{MAX_DEVICE_PAYLOAD} (it travels in the goal's history): split the work into smaller calls"
            )
        return ResolvedCall(args=args)

    @activity.defn(name=Activities.STORE_DEVICE_OUTPUT)
    async def store_output(self, output: DeviceOutput) -> ToolResult:
        """The device's outcome as the goal's ToolResult: its output kept here by reference."""
        result = output.result
        ref = await self._store.aput_text(result.output) if result.output is not None else None
        return ToolResult(
            call_id=output.call_id,
            tool=result.tool,
            risk=output.risk,
            ok=result.ok,
            output=ref,
            preview=preview(result.output) if result.output is not None else "",
            error=result.error,
            effect_key=result.effect_key,
            uncertain=result.uncertain,
            receipt=result.receipt,
            compensation=result.compensation,
            cost_usd=result.cost_usd,
            fingerprints=result.fingerprints,
        )

    @activity.defn(name=Activities.LIST_DEVICES)
    async def list_devices(self) -> DeviceListingResult:
        """Every device that ever announced itself (none while no registry exists yet), or
        why the registry could not be asked: a plan check then leaves devices to dispatch."""
        handle = self._client.get_workflow_handle(registry_id(activity.info().task_queue))
        try:
            listing = await asyncio.wait_for(
                handle.query(RegistryQueries.DEVICES, result_type=DeviceListing), timeout=LIST_TIMEOUT_S
            )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return DeviceListingResult()
            return DeviceListingResult(error=f"the device registry did not answer: {err.message}")
        except (TimeoutError, WorkflowQueryRejectedError, WorkflowQueryFailedError) as err:
            return DeviceListingResult(error=f"the device registry did not answer: {err or 'timed out'}")
        return DeviceListingResult(devices=[record.presence for record in listing.devices])
