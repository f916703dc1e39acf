"""What the goal sends to check its finished work again, and what comes back
(activities/verification.py does the checking; workflows/goal/verification.py decides
when and what it voids). Pure data, shared by the workflow and the worker."""

from __future__ import annotations

from pydantic import BaseModel, Field

from workflows.contracts import ArtifactRef, Fingerprint
from workflows.plan import VerifyDepth


class NodeCheck(BaseModel):
    node: str
    depth: VerifyDepth
    artifacts: list[ArtifactRef] = Field(default_factory=list, description="Its output (existence).")
    fingerprints: list[Fingerprint] = Field(default_factory=list)
    command: str | None = None
    expect_exit: int = 0
    timeout_s: float = 120


class VerifyInput(BaseModel):
    workspace: str
    network: bool = False
    checks: list[NodeCheck]


class VerifyResult(BaseModel):
    void: dict[str, str] = Field(default_factory=dict, description="Node -> why it no longer holds.")
    checked: int = 0
