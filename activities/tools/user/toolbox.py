"""The user tools one worker (or device) loaded (tool_modules.py loads them): their
implementations for the tool activity (user_tool_runs.py), their offer (the tools as data,
published with the worker's offer), and the catalogue activity a goal lists the tools it
names with, once, when it starts. Nothing here imports a module or runs a tool.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from temporalio import activity

from perdure.activities.tools.user.tool_decorator import ToolDeclaration
from perdure.activities.tools.user.user_tool_runs import implementation
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.shared.tool_specs import Tool
from perdure.workflows.shared.user_tools import UserTool, UserToolCatalogue, UserToolCatalogueInput


class Toolbox:
    """The user tools one worker loaded. Register `catalogue` with the worker."""

    def __init__(self, declarations: Iterable[ToolDeclaration] = (), sources: Sequence[str] = ()) -> None:
        self.declarations: dict[str, ToolDeclaration] = {d.name: d for d in declarations}
        self.sources = list(sources)

    def implementations(self) -> dict[str, Tool]:
        return {name: implementation(d) for name, d in self.declarations.items()}

    def offers(self) -> list[UserTool]:
        return [self.declarations[name].offer() for name in sorted(self.declarations)]

    @activity.defn(name=Activities.USER_TOOLS_CATALOGUE)
    async def catalogue(self, input: UserToolCatalogueInput) -> UserToolCatalogue:
        return UserToolCatalogue(
            tools={n: self.declarations[n].offer() for n in self.with_compensations(input.names)},
            loaded=sorted(self.declarations),
        )

    def with_compensations(self, names: Iterable[str]) -> list[str]:
        """The loaded tools of `names` and the compensations they name, sorted: a rollback runs
        a compensation by its own declaration (timeouts, retries, on a device too), so the
        goal must know it. One level: a compensation runs without a compensation of its own."""
        wanted = {n for n in names if n in self.declarations}
        for name in list(wanted):
            compensation = self.declarations[name].compensation
            if compensation is not None and compensation in self.declarations:
                wanted.add(compensation)
        return sorted(wanted)
