"""Tool implementations and the `run_tool` activity.

Owns what each tool in `perdure.workflows.shared.tool_specs.TOOL_SPECS` does on this machine:
file tools confined to the workspace, shell commands in the sandbox of
activities/tools/sandbox.py (no worker processes, files outside the workspace or
network unless allowed; the whole process tree ends with the step), HTTP GET with
capped bodies. Outputs go to the
artifact store; the workflow only sees a reference and a preview.

write_file is versioned and fenced (activities/tools/workspace_versions.py): it replaces a
file only if the file still holds the version the call is based on (its `base_version`,
else what the goal says its node last read or wrote: `ToolInput.based_on`), and only for
a call whose fencing token (`ToolInput.fence` and the attempt) is still its node's
newest; a superseded run_command is not started either. A read's fingerprint is the
digest of exactly the bytes it read, so a write based on it never passes over an edit
made just after the read.

Failures a model can act on (bad arguments, a missing file, a non-zero exit, a
404) come back as `ToolResult(ok=False, error=...)`. Only goal-level problems
raise `ApplicationError`: a missing workspace, a lost artifact, a malformed
`ToolInput`. Remote writes run through `perdure.activities.tools.effect_tools.run_effect`,
which owns effect keys, the retry decision and the confirmation check for
irreversible tools; this module only dispatches to it. A shell command's attempt
after an interrupted one runs only when the command is replay-safe
(`perdure.workflows.shared.effects.decide_command_retry`) and is `uncertain` otherwise. Asking a
human stays with the workflow.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import json
import os
import posixpath
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from perdure.activities.artifacts import ArtifactCorrupt, ArtifactMissing, ArtifactStore, preview
from perdure.activities.client_pool import http_client
from perdure.activities.faults import fault_point
from perdure.activities.heartbeat import Heartbeat
from perdure.activities.mcp.mcp_calls import McpEffectTool, McpServers, call_tool
from perdure.activities.quota.quota_admission import QuotaTooFar, host_admitted
from perdure.activities.spans import tool_call_span
from perdure.activities.tools import sandbox
from perdure.activities.tools.effect_tools import EFFECT_TOOLS, EffectTool, run_effect
from perdure.activities.tools.fingerprints import fingerprints_of
from perdure.activities.tools.tool_errors import OutcomeUnknown, ToolError
from perdure.activities.tools.workspace import (
    WorkspaceEscape,
    WorkspaceMissing,
    confine,
    resolve_in_workspace,
    workspace_root,
)
from perdure.activities.tools.workspace_versions import (
    UNCHECKED,
    Basis,
    FenceToken,
    FileVersion,
    WorkspaceVersions,
    WriteRefused,
    superseded_message,
)
from perdure.runtime.files import write_atomically
from perdure.workflows.goal.contracts.plan import TEMPLATE, describe_validation_error
from perdure.workflows.quota.quota_workflow import QuotaLimits
from perdure.workflows.shared.contracts import (
    Activities,
    ArtifactRef,
    Fingerprint,
    PreparedEffect,
    ToolBatchEntry,
    ToolBatchInput,
    ToolBatchResult,
    ToolInput,
    ToolResult,
)
from perdure.workflows.shared.effects import decide_command_retry, prepared_effect
from perdure.workflows.shared.mcp_tools import McpArgs, McpTool, schema_problems, schema_summary
from perdure.workflows.shared.tool_specs import (
    COMMAND_TOOLS,
    TOOL_SPECS,
    HttpGetArgs,
    ListDirArgs,
    ReadArtifactArgs,
    ReadFileArgs,
    RunCommandArgs,
    ToolArgs,
    ToolSpec,
    WriteFileArgs,
)

COMMAND_OUTPUT_CAP = 64 * 1024
"""Bytes of combined stdout+stderr kept from a command: the first half and the last half."""

COMMAND_ERROR_TAIL = 800
"""Characters of command output quoted in the error, so the model sees why without opening the artifact."""

LIST_DIR_CAP = 1_000
"""Entries listed before the rest is summarised; a node_modules must not flood the model's context."""

HTTP_TIMEOUT_S = 30.0
HEARTBEAT_EVERY_S = 5.0
POLL_EVERY_S = 0.05
MAX_ERROR_CHARS = 2_000
"""Errors travel in workflow history and into prompts; keep them short."""


# --- file tools ---------------------------------------------------------------


def _confined(root: Path, relative: str) -> Path:
    """`relative` inside `root`, the workspace's real path (run_tool resolves it once per call)."""
    try:
        return confine(root, relative)
    except WorkspaceEscape as err:
        raise ToolError(str(err)) from None


def _decode(data: bytes, encoding: str = "utf-8", *, capped: bool = False) -> str:
    """Decode text; a capped read may end mid-character, which is dropped rather than shown as garbage."""
    try:
        decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    except LookupError:
        # A server may announce a charset Python does not know.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return decoder.decode(data, final=not capped)


@dataclass
class FileCall:
    """A read_file or write_file call's part in versioning: the store, the call's fencing
    token and what its goal says it is based on; the tool sets `seen`, the version it read
    or wrote (what its fingerprint records)."""

    versions: WorkspaceVersions
    token: FenceToken | None = None
    based_on: dict[str, str | None] | None = None
    seen: FileVersion | None = None


def _read_file_sync(root: Path, args: ReadFileArgs, call: FileCall | None = None) -> str:
    path = _confined(root, args.path)
    missing = ToolError(f"'{args.path}' does not exist in the workspace")
    try:
        if call is None:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                data = f.read(args.max_bytes + 1)
        else:
            # One open for the text and the version: the digest is of the bytes read.
            data, call.seen = call.versions.read(path, args.max_bytes + 1)
            if call.seen.digest is None:
                raise missing
            size = call.seen.size
    except FileNotFoundError:
        raise missing from None
    except IsADirectoryError:
        raise ToolError(f"'{args.path}' is a directory; use list_dir to see its entries") from None
    except OSError as err:
        raise ToolError(f"cannot read '{args.path}': {err.strerror or err}") from None
    text = _capped_text(data, args.max_bytes, size, f"'{args.path}'", "read_file")
    if call is not None and call.seen is not None:
        call.versions.keep(call.seen)
    return text


def _capped_text(data: bytes, max_bytes: int, size: int, what: str, tool: str) -> str:
    """`data` (read up to max_bytes + 1 of `size` bytes) as text: refused when binary,
    with a note when cut."""
    if b"\x00" in data[:8192]:
        raise ToolError(f"{what} looks like a binary file (it contains NUL bytes); {tool} returns text only")
    if len(data) <= max_bytes:
        return _decode(data)
    text = _decode(data[:max_bytes], capped=True)
    return text + f"\n[truncated: showing the first {max_bytes} of {size} bytes of {what}]"


async def read_file(root: Path, args: ReadFileArgs, *, call: FileCall | None = None) -> str:
    # Disk I/O off the event loop: a slow disk must not stall heartbeats of other activities.
    return await asyncio.to_thread(_read_file_sync, root, args, call)


def _list_dir_sync(root: Path, args: ListDirArgs) -> str:
    path = _confined(root, args.path)
    try:
        if not path.exists():
            raise ToolError(f"'{args.path}' does not exist in the workspace")
        if not path.is_dir():
            raise ToolError(f"'{args.path}' is a file, not a directory; use read_file to read it")
        entries = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in path.iterdir())
    except OSError as err:
        raise ToolError(f"cannot list '{args.path}': {err.strerror or err}") from None
    if not entries:
        return f"(directory '{args.path}' is empty)"
    shown = entries[:LIST_DIR_CAP]
    text = "\n".join(shown)
    if len(entries) > LIST_DIR_CAP:
        text += f"\n[truncated: showing {LIST_DIR_CAP} of {len(entries)} entries]"
    return text


async def list_dir(root: Path, args: ListDirArgs) -> str:
    return await asyncio.to_thread(_list_dir_sync, root, args)


def _write_file_sync(root: Path, args: WriteFileArgs, call: FileCall | None = None) -> str:
    path = _confined(root, args.path)
    data = args.content.encode("utf-8")
    shown = path.relative_to(workspace_root(root)).as_posix()
    try:
        if path.is_dir():
            raise ToolError(f"'{args.path}' is a directory; give a file path")
        # Overwrite through a temp file and rename: a retried or crashed write leaves
        # either the old file or the new one, never a half-written or appended file.
        # `path` is already resolved and inside the workspace, so the parents it creates are too.
        # mkstemp creates 0600; keep an existing file's mode, give a new one the usual 0644.
        if call is None:
            write_atomically(path, data, mode=path.stat().st_mode & 0o7777 if path.exists() else 0o644)
        else:
            basis = _basis(root, path, args, call.based_on)
            call.seen = call.versions.write(path, data, shown=shown, basis=basis, token=call.token)
    except WriteRefused as err:
        raise ToolError(f"write_file refused: {err.message}", output=err.detail) from None
    except OSError as err:
        raise ToolError(f"cannot write '{args.path}': {err.strerror or err}") from None
    if call is not None and call.seen is not None:
        call.versions.keep(call.seen)
    return f"wrote {len(data)} bytes to {shown}"


def _basis(root: Path, path: Path, args: WriteFileArgs, based_on: dict[str, str | None] | None) -> Basis:
    """The version a write is based on: the call's own base_version, else the one its goal
    says the step (or a step it builds on) last read or wrote; no version context at all
    (a device's call, an older caller) checks nothing."""
    if args.base_version == "any":
        return Basis(check=False, why='base_version "any"')
    if args.base_version is not None:
        return Basis(check=True, seen=True, digest=args.base_version, why="the base_version you gave")
    if based_on is None:
        return UNCHECKED
    seen_by_step = "this step (or a step it builds on) last read or wrote it"
    key = posixpath.normpath(args.path)
    if key in based_on:
        return Basis(check=True, seen=True, digest=based_on[key], why=seen_by_step)
    # The same file under another spelling (`./a`, a symlink): compare real paths.
    for other, digest in based_on.items():
        try:
            if resolve_in_workspace(root, other) == path:
                return Basis(check=True, seen=True, digest=digest, why=seen_by_step)
        except (WorkspaceEscape, WorkspaceMissing):
            continue
    return Basis(check=True, seen=False)


async def write_file(root: Path, args: WriteFileArgs, *, call: FileCall | None = None) -> str:
    """Without a `call`, an unversioned overwrite (what the activity never does)."""
    return await asyncio.to_thread(_write_file_sync, root, args, call)


# --- run_command ----------------------------------------------------------------


class _CappedOutput:
    """Keeps the first and last halves of a stream; commands put the cause of a failure at the end."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            del self.tail[: max(0, len(self.tail) - self.tail_cap)]

    def text(self) -> str:
        omitted = self.total - len(self.head) - len(self.tail)
        if omitted <= 0:
            return _decode(bytes(self.head + self.tail))
        head = _decode(bytes(self.head), capped=True)
        tail = _decode(bytes(self.tail))
        return f"{head}\n[truncated: {omitted} of {self.total} bytes of output omitted]\n{tail}"


async def run_command(root: Path, args: RunCommandArgs, *, network: bool = False, hidden: tuple[Path, ...] = ()) -> str:
    """`/bin/sh -c` in the sandbox (activities/tools/sandbox.py): `network` as the goal or plan
    step allows, `hidden` masked even where it lies inside the workspace."""
    real_root = workspace_root(root)
    started = time.monotonic()
    try:
        proc = await sandbox.start(
            sandbox.Sandbox(real_root, network=network, hidden=hidden),
            ["/bin/sh", "-c", args.command],
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except sandbox.SandboxUnavailable as err:
        raise ToolError(f"run_command refused: shell commands run only in a sandbox, and {err}") from None
    captured = _CappedOutput(COMMAND_OUTPUT_CAP)

    async def pump() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65_536):
            captured.feed(chunk)

    reader = asyncio.create_task(pump())
    timed_out = False
    # Beats with or without a heartbeat timeout: they are how a cancelled activity learns it is.
    beat = Heartbeat(lambda: f"running for {time.monotonic() - started:.0f}s", every_s=_beat_every_s())
    try:
        async with beat:
            # Poll the exit status rather than await proc.wait(): wait() also waits for
            # the output pipe to close, which a background child can hold open forever.
            while proc.returncode is None:
                now = time.monotonic()
                if now - started >= args.timeout_s:
                    timed_out = True
                    break
                await asyncio.sleep(min(POLL_EVERY_S, args.timeout_s - (now - started)))
    finally:
        # SIGKILL, not SIGTERM: the tool promises a bounded wall time, and a
        # group that ignores TERM would break it. After a normal exit this also
        # removes background children that would otherwise outlive the activity
        # and keep the output pipe open. Runs on cancellation too.
        sandbox.kill_tree(proc)
        try:
            await asyncio.wait_for(asyncio.shield(reader), timeout=5)
            await asyncio.wait_for(proc.wait(), timeout=5)
        except TimeoutError:
            # Only an unsandboxed process that left the group (setsid) can hold the pipe this long.
            reader.cancel()

    output = captured.text()
    if timed_out:
        text = f"$ {args.command}\n{output}\n[killed: timed out after {args.timeout_s:g}s]"
        raise ToolError(f"timed out after {args.timeout_s:g}s; {_tail(output)}", output=text)
    code = proc.returncode
    assert code is not None  # the loop above only ends on exit or timeout
    text = f"$ {args.command}\n{output}\n[exit code {code}]"
    if code != 0:
        raise ToolError(f"command exited with {code}; {_tail(output)}", output=text)
    return text


def _beat_every_s() -> float:
    """HEARTBEAT_EVERY_S, or more often when the activity's heartbeat timeout is short."""
    timeout = activity.info().heartbeat_timeout if activity.in_activity() else None
    return min(HEARTBEAT_EVERY_S, timeout.total_seconds() / 3) if timeout else HEARTBEAT_EVERY_S


def _tail(output: str) -> str:
    stripped = output.strip()
    if not stripped:
        return "no output"
    if len(stripped) <= COMMAND_ERROR_TAIL:
        return "output:\n" + stripped
    return "last output:\n…" + stripped[-COMMAND_ERROR_TAIL:]


# --- http_get -------------------------------------------------------------------


async def http_get(root: Path, args: HttpGetArgs) -> str:
    del root  # http_get does not touch the workspace
    body = bytearray()
    truncated = False
    try:
        client = http_client(HTTP_TIMEOUT_S, follow_redirects=True)
        async with client.stream("GET", args.url) as response:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > args.max_bytes:
                    truncated = True
                    del body[args.max_bytes :]
                    break
            status = response.status_code
            encoding = response.encoding or "utf-8"
            final_url = str(response.url)
    except httpx.HTTPError as err:
        raise ToolError(f"GET {args.url} failed: {type(err).__name__}: {err or 'no detail'}") from None

    text = _decode(bytes(body), encoding, capped=truncated)
    if not 200 <= status < 300:
        raise ToolError(f"GET {args.url} returned HTTP {status}; body starts: {preview(text, 300) or '(empty)'}")
    if b"\x00" in body[:8192]:
        raise ToolError(f"GET {args.url} returned binary content; http_get returns text only")
    if truncated:
        text += f"\n[truncated: showing the first {args.max_bytes} bytes of {final_url}]"
    return text


async def read_artifact(store: ArtifactStore, _root: Path, args: ReadArtifactArgs) -> str:
    """An earlier output in full, from the artifact store (the workspace plays no part)."""
    try:
        data = await asyncio.to_thread(store.get_bytes, args.digest)
    except ArtifactMissing:
        raise ToolError(f"no output with digest {args.digest}; use a digest shown in this conversation") from None
    except ArtifactCorrupt as err:
        raise ToolError(f"the output {args.digest} cannot be read: {err}") from None
    return _capped_text(data, args.max_bytes, len(data), f"the output {args.digest}", "read_artifact")


# --- registry and activity ------------------------------------------------------

# Called with the workspace's real path (workspace_root) and the checked arguments.
ToolFunction = Callable[[Path, Any], Awaitable[str]]

TOOL_FUNCTIONS: dict[str, ToolFunction | EffectTool] = {
    "read_file": read_file,
    "list_dir": list_dir,
    "write_file": write_file,
    "run_command": run_command,
    "http_get": http_get,
    **EFFECT_TOOLS,
}

WORKSPACE_TOOLS = frozenset(
    {"read_file", "list_dir", "write_file", "run_command"}
    | {name for name, tool in EFFECT_TOOLS.items() if tool.needs_workspace}
)
"""Tools that need the workspace on this machine; HTTP tools may run on a worker that has none."""

FILE_TOOLS = frozenset({"read_file", "write_file"})
"""Tools that read or write a file's version (activities/tools/workspace_versions.py)."""
REFUSED_WHEN_SUPERSEDED = frozenset({"write_file", "run_command"})
"""A superseded call of these is not started: its node's newer work must not be overwritten.
Other workspace calls still present their token (a newer run's read fences the older run's writes)."""


class _BadArguments(Exception):
    """Arguments the model or plan got wrong; becomes ok=False."""


class ToolActivities:
    """Worker-side tool runner. Register `ToolActivities(store).run_tool` with the worker."""

    def __init__(
        self,
        store: ArtifactStore,
        quotas: Callable[[], dict[str, QuotaLimits]] | None = None,
        mcp: McpServers | None = None,
    ) -> None:
        self.store = store
        # The declared quotas (config.toml, reloaded): http_get draws on its host's.
        self._quotas = quotas or dict
        # The MCP servers config.toml names: a goal's MCP tools are called through them.
        self._mcp = mcp or McpServers({})
        self.versions = WorkspaceVersions(store)
        self.functions: dict[str, ToolFunction | EffectTool] = {
            **TOOL_FUNCTIONS,
            "read_artifact": functools.partial(read_artifact, store),
        }

    @activity.defn(name=Activities.RUN_TOOLS)
    async def run_tools(self, input: ToolBatchInput) -> ToolBatchResult:
        """Replay-safe calls a goal made together (workflows/goal/read_batch.py), side by side.
        A call that raises is answered with its error, not raised: the goal runs that one
        alone with its own retries, and the others' results stand."""

        real_roots: dict[str, Path] = {}

        async def one(call: ToolInput, summary: str) -> ToolBatchEntry:
            try:
                return ToolBatchEntry(call=summary, result=await self._run(call, real_roots))
            except Exception as err:  # noqa: BLE001 - the goal re-runs this call alone
                return ToolBatchEntry(call=summary, error=f"{type(err).__name__}: {err}"[:2000])

        summaries = input.summaries + [""] * (len(input.calls) - len(input.summaries))
        entries = await asyncio.gather(*(one(call, summaries[i]) for i, call in enumerate(input.calls)))
        size = sum(len(entry.model_dump_json().encode()) for entry in entries)
        return ToolBatchResult(entries=list(entries), size_bytes=size)

    def _spec(self, input: ToolInput) -> ToolSpec | None:
        """A built-in tool's spec, or an MCP tool's from the goal's catalogue entry (with the
        graver risk class of the goal's and this worker's config)."""
        if input.tool in TOOL_SPECS:
            return TOOL_SPECS[input.tool]
        if input.mcp is not None and input.mcp.name == input.tool:
            return self._mcp.graver(input.mcp).spec()
        return None

    def _implementation(self, input: ToolInput, spec: ToolSpec) -> ToolFunction | EffectTool:
        if input.mcp is None or input.tool in self.functions:
            return self.functions[input.tool]
        if spec.replay == "safe" and spec.risk in ("read", "local-write"):
            return functools.partial(self._mcp_read, input.mcp)
        return McpEffectTool(self._mcp, input.mcp)

    async def _mcp_read(self, tool: McpTool, _root: Path, args: McpArgs) -> str:
        """An MCP tool that is safe to run again: called directly; no answer is a failure
        the model or the step sees, and running it again is free."""
        try:
            return await call_tool(self._mcp, tool, args, effect_key=None)
        except OutcomeUnknown as err:
            raise ToolError(str(err)) from None

    @activity.defn(name=Activities.RUN_TOOL)
    async def run_tool(self, input: ToolInput) -> ToolResult:
        return await self._run(input, {})

    async def _run(self, input: ToolInput, real_roots: dict[str, Path]) -> ToolResult:
        """One call; `real_roots` holds the workspaces already resolved by the calls it runs beside."""
        spec = self._spec(input)
        if spec is None or (input.tool not in self.functions and input.mcp is None):
            known = ", ".join(sorted(self.functions))
            return ToolResult(
                call_id=input.call_id, tool=input.tool, ok=False, error=f"unknown tool '{input.tool}' (known: {known})"
            )

        def failed(message: str, output: str | None = None) -> ToolResult:
            ref = self.store.put_text(output) if output is not None else None
            return ToolResult(
                call_id=input.call_id,
                tool=input.tool,
                risk=spec.risk,
                ok=False,
                output=ref,
                preview=preview(output) if output is not None else "",
                error=_clip(message),
            )

        root = Path(input.workspace)
        if input.tool in WORKSPACE_TOOLS:
            try:
                # Resolved once here: the tool confines its paths under this real root.
                if input.workspace not in real_roots:
                    real_roots[input.workspace] = workspace_root(root)
                root = real_roots[input.workspace]
            except WorkspaceMissing as err:
                # The goal points at a workspace this machine does not have: no
                # model turn or retry can fix that.
                raise ApplicationError(str(err), type="WorkspaceMissing", non_retryable=True) from None

        try:
            args = self._arguments(input, spec)
        except _BadArguments as err:
            return failed(str(err))

        token = _fence_token(input) if input.tool in WORKSPACE_TOOLS else None
        if token is not None:
            superseded = await asyncio.to_thread(self.versions.claim, token)
            if superseded is not None and input.tool in REFUSED_WHEN_SUPERSEDED:
                activity.logger.warning("superseded call refused", extra={"tool": input.tool, "why": superseded})
                return failed(superseded_message(input.tool, token, superseded))
        if isinstance(args, RunCommandArgs):
            settled = self._command_not_run(input, args, spec)
            if settled is not None:
                return settled
        implementation = self._implementation(input, spec)
        file_call = FileCall(self.versions, token, input.based_on) if input.tool in FILE_TOOLS else None
        if file_call is not None:
            implementation = functools.partial(implementation, call=file_call)
        if input.tool in COMMAND_TOOLS:
            implementation = functools.partial(
                implementation, network=input.network, hidden=tuple(sandbox.hidden_paths(self.store.root))
            )
        async with Heartbeat() as beat:
            if isinstance(implementation, EffectTool):
                with tool_call_span(spec):
                    return await run_effect(implementation, spec, input, args, self.store, beat)
            try:
                with tool_call_span(spec) as span:
                    if isinstance(args, HttpGetArgs):
                        async with host_admitted(self._quotas(), args.url):
                            text = await implementation(root, args)
                    else:
                        text = await implementation(root, args)
                    span.set_attribute("perdure.output_chars", len(text))
            except QuotaTooFar as err:
                return failed(str(err))
            except ToolError as err:
                activity.logger.info("tool failed", extra={"tool": input.tool, "error": err.message})
                return failed(err.message, err.output)
            fault_point("tool_done", input.tool)
        ref = self.store.put_text(text)
        seen = file_call.seen.digest if file_call is not None and file_call.seen is not None else None
        if seen is not None:
            # The version the call read or wrote, digested from its own open: no second one.
            fingerprints = fingerprints_of(input.tool, root, args, text, digest=seen)
        else:
            fingerprints = await asyncio.to_thread(fingerprints_of, input.tool, root, args, text)
        return ToolResult(
            call_id=input.call_id,
            tool=input.tool,
            risk=spec.risk,
            ok=True,
            output=ref,
            preview=preview(text),
            fingerprints=_as_seen(fingerprints, file_call, args),
        )

    def _command_not_run(self, input: ToolInput, args: RunCommandArgs, spec: ToolSpec) -> ToolResult | None:
        """A command call answered without running it: a person said its interrupted run
        happened, or this attempt follows an interrupted one and the command is not
        replay-safe. None: run it."""
        if input.resolution == "happened":
            text = (
                f"$ {args.command}\n[not run again: a person answered that the interrupted run happened; "
                "its output and exit code were lost with that run]"
            )
            ref = self.store.put_text(text)
            return ToolResult(
                call_id=input.call_id, tool=input.tool, risk=spec.risk, ok=True, output=ref, preview=preview(text)
            )
        attempt = activity.info().attempt if activity.in_activity() else 1
        if decide_command_retry(attempt, args) == "run":
            return None
        activity.logger.warning("command uncertain", extra={"attempt": attempt, "command": args.command[:200]})
        return ToolResult(
            call_id=input.call_id,
            tool=input.tool,
            risk=spec.risk,
            ok=False,
            uncertain=True,
            error=_clip(
                f"an earlier attempt of run_command was interrupted (its worker was lost or it timed out) "
                f"and may have run `{preview(args.command, 300)}`; a command that is neither declared "
                'replay: "safe" nor read-only is never run twice on its own: a person must check and decide'
            ),
        )

    @activity.defn(name=Activities.PREPARE_EFFECT)
    async def prepare_effect(self, input: ToolInput) -> PreparedEffect:
        """Resolve a remote write's arguments without sending anything: what it will do,
        its effect key and its compensation, for the goal to record (and a person to
        confirm) before the effect can happen. Reads the artifact store only."""
        spec = self._spec(input)
        if spec is None:
            return PreparedEffect(tool=input.tool, error=f"unknown tool '{input.tool}'")
        try:
            args = self._arguments(input, spec)
        except _BadArguments as err:
            return PreparedEffect(tool=input.tool, error=_clip(str(err)))
        return prepared_effect(input.goal_id, input.tool, args, input.workspace)

    def resolved_arguments(self, input: ToolInput) -> tuple[dict | None, str | None]:
        """A call's arguments resolved here (templates filled in from this store, a model's
        JSON read) and validated, as JSON to send elsewhere; or why they cannot be used."""
        spec = self._spec(input)
        if spec is None:
            return None, f"unknown tool '{input.tool}' (known: {', '.join(sorted(TOOL_SPECS))})"
        try:
            return self._arguments(input, spec).model_dump(mode="json"), None
        except _BadArguments as err:
            return None, _clip(str(err))

    def _arguments(self, input: ToolInput, spec: ToolSpec) -> ToolArgs:
        """The call's arguments, resolved and validated; _BadArguments says what is wrong."""
        raw = self._raw_args(input)
        # Templates belong to plan steps; a model writes literal text, and
        # `{{steps.x}}` in a file it writes must stay as written.
        resolved = self._resolve_templates(raw, input.inputs) if input.args_ref is None and not input.resolved else raw
        try:
            args = spec.args_model.model_validate(resolved)
        except ValidationError as err:
            raise _BadArguments(
                f"bad arguments for {input.tool}: {describe_validation_error(err)}; {_expected_fields(spec.args_model)}"
            ) from None
        if spec.input_schema is not None:
            # An MCP tool's own schema: checked here, so a wrong call goes back to the model
            # without reaching its server.
            problems = schema_problems(spec.input_schema, args.model_dump(mode="json"))
            if problems:
                summary = schema_summary(spec.input_schema)
                raise _BadArguments(f"bad arguments for {input.tool}: {'; '.join(problems)}; {summary}")
        return args

    def _raw_args(self, input: ToolInput) -> dict:
        if input.args is not None and input.args_ref is not None:
            raise ApplicationError(
                f"tool call {input.tool} got both args and args_ref; the workflow must send one",
                type="BadToolInput",
                non_retryable=True,
            )
        if input.args_ref is None:
            return dict(input.args or {})
        text = self._load(input.args_ref, f"the arguments of {input.tool}").decode("utf-8", errors="replace")
        try:
            value = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as err:
            raise _BadArguments(f"arguments for {input.tool} are not valid JSON: {err}") from None
        if not isinstance(value, dict):
            raise _BadArguments(f"arguments for {input.tool} must be a JSON object, got {type(value).__name__}")
        return value

    def _resolve_templates(self, value: Any, inputs: dict[str, ArtifactRef]) -> Any:
        """Replace `{{steps.NAME}}` in every string with that step's output text."""
        if isinstance(value, dict):
            return {k: self._resolve_templates(v, inputs) for k, v in value.items()}
        if isinstance(value, list):
            return [self._resolve_templates(v, inputs) for v in value]
        if not isinstance(value, str):
            return value
        missing = [name for name in TEMPLATE.findall(value) if name not in inputs]
        if missing:
            available = ", ".join(sorted(inputs)) or "none"
            raise _BadArguments(
                f"argument uses {{{{steps.{missing[0]}}}}} but no output of step '{missing[0]}' "
                f"was passed to this tool call (available: {available})"
            )

        def output_text(match: re.Match[str]) -> str:
            name = match.group(1)
            return self._load(inputs[name], f"the output of step '{name}'").decode("utf-8", errors="replace")

        return TEMPLATE.sub(output_text, value)

    def _load(self, ref: ArtifactRef, what: str) -> bytes:
        try:
            return self.store.get_bytes(ref)
        except (ArtifactMissing, ArtifactCorrupt) as err:
            # The store is this machine's disk: retrying here will not bring the
            # blob back. The workflow decides (re-run the producer, or fail).
            raise ApplicationError(f"cannot load {what}: {err}", type=type(err).__name__, non_retryable=True) from None


def _fence_token(input: ToolInput) -> FenceToken | None:
    """The call's fencing token: what the goal says (node, run, workflow task) and this attempt."""
    fence = input.fence
    if fence is None:
        return None
    attempt = activity.info().attempt if activity.in_activity() else 1
    return FenceToken(
        goal=input.goal_id,
        chain=fence.chain,
        node=fence.node,
        run=fence.run,
        task=fence.task,
        attempt=attempt,
        call=input.node_key,
    )


def _as_seen(fingerprints: list[Fingerprint], call: FileCall | None, args: ToolArgs) -> list[Fingerprint]:
    """A file tool's fingerprint with the digest of the version it read or wrote, not of the
    file a moment later: a person's save in between must not count as seen by the step."""
    if call is None or call.seen is None or not isinstance(args, ReadFileArgs | WriteFileArgs):
        return fingerprints
    source = f"file:{args.path}"
    return [p.model_copy(update={"digest": call.seen.digest}) if p.source == source else p for p in fingerprints]


def _expected_fields(model: type[ToolArgs]) -> str:
    fields = [f"{name} (required)" if field.is_required() else name for name, field in model.model_fields.items()]
    return "expected fields: " + ", ".join(fields)


def _clip(message: str) -> str:
    return message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 1] + "…"
