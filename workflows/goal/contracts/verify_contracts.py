"""What the goal sends to check its finished work again, and what comes back
(activities/goal/recheck.py does the checking; workflows/goal/verification.py decides
when and what it voids). Pure data, shared by the workflow and the worker: the checks
of one activity (`perdure.verify.nodes`, which also digests the files around a goal's
command step: `VerifyInput.look_at`), and the model question a step's `verify` may ask
(`Activities.VERIFY_QUESTION`, one call per step)."""

from __future__ import annotations

import posixpath
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from perdure.workflows.goal.contracts.goal_contracts import ModelContext, Usage
from perdure.workflows.goal.contracts.plan import VerifyDepth
from perdure.workflows.shared.contracts import ArtifactRef, Fingerprint

# What one re-fetch of a URL may take (activities/tools/http_calls.py's HTTP_TIMEOUT_S): the
# check's activity is given that much more per URL it re-fetches.
REFETCH_TIMEOUT_S = 30


def source_key(source: str) -> str:
    """A fingerprint's source as one key per file: `file:./a.md` and `file:a.md` are one."""
    kind, _, path = source.partition(":")
    return f"{kind}:{posixpath.normpath(path)}" if kind in ("file", "dir") else source


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
    network: bool = Field(default=False, description="The goal allows the network: a `verify` command gets it.")
    refetch: bool | None = Field(
        default=None,
        description="URLs read are re-fetched: the goal may call http_get (which, like the tool, does not depend "
        "on `network`). None: as `network` (an input from before the two were told apart).",
    )
    checks: list[NodeCheck] = Field(default_factory=list)
    look_at: list[str] = Field(
        default_factory=list,
        description="file: and dir: sources to digest as they are now, nothing checked (the goal's look around "
        "one of its command steps): VerifyResult.looked.",
    )

    def refetches(self) -> bool:
        return self.network if self.refetch is None else self.refetch


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
    looked: list[Fingerprint] = Field(
        default_factory=list, description="`look_at`, digested now: kind `seen`, in the order asked."
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
