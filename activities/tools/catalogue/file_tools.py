"""read_file, list_dir, write_file and read_artifact: the workspace's files and the goal's
earlier outputs, read and written on the machine that has them.

Reads and overwrites inside the workspace: `safe` to run again. write_file is versioned
(it replaces a file only if the file still holds the version the call is based on), so
the goal sends it what the node saw. Their work on the disk is in
activities/tools/workspace_files.py.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from perdure.activities.tools.catalogue.tool_base import LocalCall, LocalTool
from perdure.workflows.shared.tool_specs import ToolArgs, ToolSpec, preview_value

COMPACTION_TOOL = "read_artifact"
"""Offered to an agent by the runtime, not by the plan: on a turn whose prompt was
compacted, so the model can read in full an output it sees as one line."""
BASE_VERSION = r"^sha256:[0-9a-f]{64}$"


class ReadFileArgs(ToolArgs):
    path: str = Field(description="Path relative to the workspace root.")
    max_bytes: int = Field(default=65_536, ge=1, le=1_048_576)


class ListDirArgs(ToolArgs):
    path: str = Field(default=".", description="Directory relative to the workspace root.")


class WriteFileArgs(ToolArgs):
    path: str = Field(description="Path relative to the workspace root; the file is overwritten.")
    content: str
    base_version: str | None = Field(
        default=None,
        description="The version of the file your content is based on (a sha256:... digest). Leave it out to "
        "use the version this step last read or wrote; a file it never saw must not exist yet. "
        '"any" replaces whatever the file holds (only when told to discard what is there).',
    )

    @field_validator("base_version", mode="before")
    @classmethod
    def _a_version_or_any(cls, value: object) -> object:
        if value is None or value == "any":
            return value
        expected = 'base_version must be "any" or a file version: "sha256:" and 64 lower-case hex digits'
        if not isinstance(value, str):
            raise ValueError(f"{expected}; got {type(value).__name__} {preview_value(value)}")
        if len(value) > 100:
            raise ValueError(f"{expected}; got a string of {len(value)} characters")
        if not re.fullmatch(BASE_VERSION, value):
            raise ValueError(f"{expected}; got {value!r}")
        return value


class ReadArtifactArgs(ToolArgs):
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$", description="Digest of an output named in the conversation.")
    max_bytes: int = Field(default=65_536, ge=1, le=1_048_576)


class ReadFile(LocalTool):
    spec = ToolSpec(
        name="read_file",
        replay="safe",
        expected_s=0.1,
        risk="read",
        description="Read a text file inside the workspace.",
        args_model=ReadFileArgs,
        needs_workspace=True,
        on_devices=True,
    )
    example = {"path": "notes/plan.md"}

    async def run(self, call: LocalCall, args: ReadFileArgs) -> str:
        from perdure.activities.tools.workspace_files import read_file

        return await read_file(call.root, args, call=call.file)


class ListDir(LocalTool):
    spec = ToolSpec(
        name="list_dir",
        replay="safe",
        expected_s=0.1,
        risk="read",
        description="List the entries of a directory inside the workspace.",
        args_model=ListDirArgs,
        needs_workspace=True,
        on_devices=True,
        low_value=True,
    )
    example = {"path": "notes"}

    async def run(self, call: LocalCall, args: ListDirArgs) -> str:
        from perdure.activities.tools.workspace_files import list_dir

        return await list_dir(call.root, args)


class ReadArtifact(LocalTool):
    spec = ToolSpec(
        name=COMPACTION_TOOL,
        replay="safe",
        expected_s=0.1,
        risk="read",
        description="Read an earlier output in full by its artifact digest (a compacted conversation "
        "names the digest of each output it shortened).",
        args_model=ReadArtifactArgs,
    )
    example = {"digest": "sha256:" + "0" * 64}

    async def run(self, call: LocalCall, args: ReadArtifactArgs) -> str:
        from perdure.activities.tools.workspace_files import read_artifact

        return await read_artifact(call.store, args)


class WriteFile(LocalTool):
    spec = ToolSpec(
        name="write_file",
        replay="safe",
        expected_s=0.1,
        risk="local-write",
        description="Create or overwrite a text file inside the workspace. Writes are versioned: a file "
        "that changed since this step last read or wrote it (a person edited it, another step wrote it) is "
        "not overwritten; the call fails with what changed, and you read the file again and re-apply your "
        "change. Read an existing file before replacing it.",
        args_model=WriteFileArgs,
        needs_workspace=True,
        on_devices=True,
        versioned_write=True,
        refused_when_superseded=True,
    )
    example = {"path": "SUMMARY.md", "content": "# Summary\n"}

    async def run(self, call: LocalCall, args: WriteFileArgs) -> str:
        from perdure.activities.tools.workspace_files import write_file

        return await write_file(call.root, args, call=call.file)


DECLARED = (ReadFile(), ListDir(), ReadArtifact(), WriteFile())
