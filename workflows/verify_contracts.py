"""What the goal sends to check its finished work again, and what comes back
(activities/verification.py does the checking; workflows/goal/verification.py decides
when and what it voids). Pure data, shared by the workflow and the worker: the checks
of one activity (`perdure.verify.nodes`), and the model question a step's `verify`
may ask (`perdure.model.verify_question`, one call per step)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from workflows.contracts import ArtifactRef, Fingerprint, ModelContext, Usage
from workflows.plan import VerifyDepth

# Stable activity name (histories depend on it); next to its payloads rather than in
# workflows/contracts.py's Activities, which this module's owner does not edit.
VERIFY_QUESTION = "perdure.model.verify_question"
# What one re-fetch of a URL may take (activities/tools.py's HTTP_TIMEOUT_S): the
# check's activity is given that much more per URL it re-fetches.
REFETCH_TIMEOUT_S = 30


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
    network: bool = Field(default=False, description="The goal allows the network: URLs read are re-fetched.")
    checks: list[NodeCheck]


class VerifyResult(BaseModel):
    void: dict[str, str] = Field(default_factory=dict, description="Node -> why it no longer holds.")
    checked: int = 0
    unchecked: dict[str, str] = Field(
        default_factory=dict,
        description="Node -> what of it could not be checked (so it is kept): a URL not re-fetched.",
    )
    changed: list[str] = Field(
        default_factory=list,
        description="What the checked steps read that is not as they read it now, a line each (a question's evidence).",
    )


VerdictKind = Literal["holds", "void", "unjudged"]


class QuestionInput(BaseModel):
    """One step's `verify: {question}`, with what the model is shown besides the goal."""

    context: ModelContext
    step: str
    question: str
    output: ArtifactRef | None = Field(default=None, description="The step's output: the activity reads it in full.")
    preview: str = Field(default="", description="What is shown when the output cannot be read.")
    finished_at: datetime | None = None
    conclusions: list[str] = Field(
        default_factory=list, description="Conclusions the goal recorded after the step finished, one line each."
    )
    changed: list[str] = Field(default_factory=list, description="Files and URLs the goal read that changed since.")


class QuestionResult(BaseModel):
    verdict: VerdictKind
    reason: str
    usage: Usage
    model: str
