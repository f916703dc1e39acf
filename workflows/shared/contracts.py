"""Payloads more than one workflow and the tool plumbing share: the task queue's name, artifact
references, a tool call's input, result and fingerprints, and a prepared effect."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from perdure.workflows.shared.mcp_tools import McpTool
from perdure.workflows.shared.tool_specs import Compensation, RiskClass

TASK_QUEUE = "perdure"


class ArtifactRef(BaseModel):
    """A content-addressed blob in the artifact store."""

    model_config = ConfigDict(frozen=True)

    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    size: int = Field(ge=0)
    media_type: str = "text/plain"


class Fingerprint(BaseModel):
    """What a tool call read or wrote, and its digest then: checked again before a goal
    resumes after a long wait (workflows/goal/verification.py). A read holds while the
    source is as the goal last left it: its own later writes are not a change from outside."""

    kind: Literal["read", "wrote", "seen", "changed"] = Field(
        description="read: a step read it (checked again); wrote: a step wrote it; seen and changed: the "
        "goal looked at it just before and just after one of its own command steps, which changed it "
        "(kept only then): `changed` counts as the goal's own write, a `seen` unlike what the goal last "
        "knew shows a change from outside (workflows/goal/nodes/tool.py)."
    )
    source: str = Field(
        description="file:PATH or dir:PATH, relative to the workspace; url:URL, a URL http_get fetched, exactly "
        "as the call's arguments gave it (its digest is of the text the tool returned)."
    )
    digest: str | None = Field(description="sha256 of the bytes (of the listing, for a directory); None: missing.")
    at: datetime


class ToolResult(BaseModel):
    """Outcome of one tool call. Failures the model can act on are data, not errors.

    For remote writes: `effect_key` names the effect; `receipt` is the service's
    small proof of it (message id, commit sha, payment id); `uncertain` means
    perdure cannot know whether the effect happened (`error` says what is
    unknown) and will not guess; `compensation` is set whenever the effect may
    have happened and can be undone.
    """

    call_id: str | None = None
    tool: str
    risk: RiskClass | None = None
    ok: bool
    output: ArtifactRef | None = None
    preview: str = ""
    error: str | None = None
    effect_key: str | None = None
    uncertain: bool = False
    receipt: dict | None = None
    compensation: Compensation | None = None
    fingerprints: list[Fingerprint] = Field(default_factory=list, description="Workspace files it read or wrote.")
    cost_usd: float = Field(
        default=0.0,
        ge=0,
        # Left out when nothing was reported: the results of the built-in tools stay as they were.
        exclude_if=lambda cost: not cost,
        description="What the call reported it cost (a user tool's `call.cost`): charged to the goal's budget.",
    )


class WorkspaceFence(BaseModel):
    """A tool call's fencing token, but for the activity's attempt (the worker adds it): a
    workspace write or command whose token is older than one its node has already used is
    refused (activities/tools/workspace_versions.py)."""

    chain: str = Field(description="The goal's first run id: a goal started again under its id is a new chain.")
    node: str
    run: int = Field(description="The node's run (Node.runs): a rewound, voided or resumed node has a newer one.")
    task: int = Field(
        description="History length of the workflow task that made the call: a call made again after its worker "
        "was lost mid-task, and every later call of the node, has a larger one."
    )


class ToolInput(BaseModel):
    goal_id: str
    node_key: str
    tool: str
    workspace: str
    args: dict | None = Field(default=None, description="Arguments from a plan step.")
    args_ref: ArtifactRef | None = Field(default=None, description="Arguments written by a model (JSON text).")
    inputs: dict[str, ArtifactRef] = Field(default_factory=dict, description="Outputs for {{steps.NAME}} templates.")
    call_id: str | None = None
    confirmed: bool = Field(default=False, description="A human confirmed this call; required for irreversible tools.")
    resolution: Literal["happened", "not_happened"] | None = Field(
        default=None,
        description="A person's answer about an uncertain earlier call: 'happened' records it without sending, "
        "'not_happened' sends it again.",
    )
    network: bool = Field(
        default=False,
        description="A command tool's sandbox keeps the network: the goal allows it, or the plan step says "
        "network: true. Set by the workflow, never from a model's arguments.",
    )
    resolved: bool = Field(
        default=False,
        description="`args` were resolved on a worker already (a device call): `{{steps.NAME}}` in them is "
        "literal text, not a template.",
    )
    fence: WorkspaceFence | None = Field(default=None, description="Set by the goal for a node's calls.")
    based_on: dict[str, str | None] | None = Field(
        default=None,
        description="A versioned write (write_file): file path -> its version (sha256) as the node, or a step it "
        "needs, last read or wrote it (None: it did not exist); a file not named was never seen. None: no "
        "version context (a device's call), so only the call's own base_version is checked.",
    )
    mcp: McpTool | None = Field(
        default=None,
        description="A tool from an MCP server: its entry in the goal's catalogue (its schema, risk and replay "
        "policy), never how to reach the server.",
    )


class ToolBatchInput(BaseModel):
    """Replay-safe calls a goal made in one workflow activation, run by one local activity."""

    calls: list[ToolInput] = Field(min_length=1)
    summaries: list[str] = Field(default_factory=list, description="Each call's summary, echoed in its entry.")
    batch: int | None = Field(
        default=None,
        description="The batch's number in its goal run: the worker keeps its answers until its workflow task "
        "is recorded, for a worker that runs it again after a crash (activities/tools/batch_journal.py). "
        "None: nothing kept.",
    )
    recorded_below: int = Field(default=0, description="The run's batches numbered below this are in history.")


class ToolBatchEntry(BaseModel):
    """One call's outcome in a batch: its result, or the error it raised (the goal then runs
    that call alone, as it would have without the batch, so errors keep their retries).
    `call` is the call's summary ("tool read_file · STEP · KEY"), so the history says which
    step each result is for."""

    call: str = ""
    result: ToolResult | None = None
    error: str | None = None


class ToolBatchResult(BaseModel):
    entries: list[ToolBatchEntry]
    size_bytes: int = Field(default=0, description="The entries as JSON, in bytes: what the result adds to history.")


class PreparedEffect(BaseModel):
    """A remote write's call resolved before it is sent: what it will do (the arguments a
    person confirms), the effect key it will carry and the call that would undo it, so
    the goal records the compensation before the effect can happen. `error`: the
    arguments cannot be used (the call would fail the same way)."""

    tool: str
    error: str | None = None
    effect_key: str | None = None
    compensation: Compensation | None = None
    arguments: str = Field(default="", description="The resolved arguments as canonical JSON, clipped.")
    arguments_digest: str | None = None


# --- report -------------------------------------------------------------------
