"""`perdure tools`: what the workers of the task queue offer, one row per tool (the built-in
ones, and the user's own with the module that declares them), and how it prints.

Read from a worker's published offer (workflows/offers/worker_offers.py), so it shows what a
running worker loaded, not what this machine could import. MCP tools are listed by a goal
that names their server (only then are the servers asked), so only the servers are shown.
"""

from __future__ import annotations

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.workflows.offers.worker_offers import CapabilitiesResult
from perdure.workflows.shared.tool_specs import ReplayPolicy, RiskClass

BUILT_IN = "built-in"


class ToolRow(BaseModel):
    name: str
    risk: RiskClass
    replay: ReplayPolicy
    source: str
    compensation: str | None = None
    network: bool = False
    devices: bool = False
    max_cost_usd: float | None = None
    description: str = ""


def offered_tools(offer: CapabilitiesResult) -> list[ToolRow]:
    """The offer's tools: the built-in ones in catalogue order, then the user's own by name."""
    rows = [
        ToolRow(
            name=name,
            risk=spec.risk,
            replay=spec.replay,
            source=BUILT_IN,
            compensation=spec.compensation,
            devices=spec.on_devices,
            description=spec.description,
        )
        for name, spec in TOOL_SPECS.items()
        if name in offer.tools
    ]
    rows += [
        ToolRow(
            name=tool.name,
            risk=tool.risk,
            replay=tool.replay,
            source=tool.module or "your module",
            compensation=tool.compensation,
            network=tool.network,
            devices=tool.on_devices,
            max_cost_usd=tool.max_cost_usd,
            description=tool.description,
        )
        for tool in sorted(offer.user_tools, key=lambda t: t.name)
    ]
    return rows


def print_tools(console: Console, rows: list[ToolRow], mcp_servers: list[str], task_queue: str) -> None:
    table = Table(title=f"tools of the worker on task queue '{task_queue}'")
    for column in ("tool", "risk", "replay", "from", "notes"):
        table.add_column(column)
    for row in rows:
        table.add_row(escape(row.name), row.risk, row.replay, escape(row.source), escape(_notes(row)))
    console.print(table)
    if mcp_servers:
        console.print(f"MCP servers (tools mcp__SERVER__TOOL, listed when a goal names them): {', '.join(mcp_servers)}")


def _notes(row: ToolRow) -> str:
    notes = []
    if row.compensation:
        notes.append(f"undone by {row.compensation}")
    if row.network:
        notes.append("network")
    if row.devices:
        notes.append("devices")
    if row.max_cost_usd is not None:
        notes.append(f"at most {row.max_cost_usd:g} USD a call")
    return ", ".join(notes)
