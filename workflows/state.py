"""The goal's one state object: what continue-as-new will carry.

Everything the goal knows lives here (plan versions, nodes, output cache,
ledger, phase), so a new run can resume from it. `schema_version` gates
loading: a state written by another version must be migrated explicitly.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from workflows.contracts import ArtifactRef, GoalResult, GoalSpec, NodeKind, NodeStatus
from workflows.plan import Plan

SCHEMA_VERSION = 1

Phase = Literal["planning", "running", "reporting", "finished", "failed"]


class Node(BaseModel):
    """One plan step as executed. `key` is set once the step is ready."""

    name: str
    kind: NodeKind
    needs: list[str] = Field(default_factory=list)
    status: NodeStatus = "pending"
    key: str | None = None
    output: ArtifactRef | None = None
    preview: str = ""
    error: str | None = None
    reused: bool = False
    turns: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    started_at: datetime | None = None
    finished_at: datetime | None = None


class KindStats(BaseModel):
    runs: int = 0
    seconds: list[float] = Field(default_factory=list)
    costs_usd: list[float] = Field(default_factory=list)
    tokens: list[int] = Field(default_factory=list)


class Ledger(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    model_calls: int = 0
    tool_calls: int = 0
    by_kind: dict[str, KindStats] = Field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class PlanVersion(BaseModel):
    version: int
    plan: Plan
    reason: str
    source: Literal["planner", "plan-file"]


class GoalState(BaseModel):
    schema_version: int = SCHEMA_VERSION
    spec: GoalSpec
    phase: Phase = "planning"
    plan_versions: list[PlanVersion] = Field(default_factory=list)
    nodes: dict[str, Node] = Field(default_factory=dict)
    outputs_by_key: dict[str, ArtifactRef] = Field(default_factory=dict)
    ledger: Ledger = Field(default_factory=Ledger)
    failure: str | None = None
    result: GoalResult | None = None

    @property
    def plan(self) -> Plan | None:
        return self.plan_versions[-1].plan if self.plan_versions else None


class GoalInput(BaseModel):
    """Workflow input: the spec, plus the carried state when continuing as new."""

    spec: GoalSpec
    state: GoalState | None = None
