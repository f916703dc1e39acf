"""The tool catalogue: names, risk classes and argument contracts.

Pure data shared by the planner prompt, plan validation in the workflow and the
tool activities. Implementations live in `activities/tools.py`; this module must
never import them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RiskClass = Literal["read", "local-write", "remote-write", "irreversible"]


class ToolArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReadFileArgs(ToolArgs):
    path: str = Field(description="Path relative to the workspace root.")
    max_bytes: int = Field(default=65_536, ge=1, le=1_048_576)


class ListDirArgs(ToolArgs):
    path: str = Field(default=".", description="Directory relative to the workspace root.")


class WriteFileArgs(ToolArgs):
    path: str = Field(description="Path relative to the workspace root; the file is overwritten.")
    content: str


class RunCommandArgs(ToolArgs):
    command: str = Field(description="Shell command, run with /bin/sh in the workspace root.")
    timeout_s: float = Field(default=60, gt=0, le=600)


class HttpGetArgs(ToolArgs):
    url: str = Field(pattern=r"^https?://", description="http or https URL.")
    max_bytes: int = Field(default=65_536, ge=1, le=1_048_576)


class ToolSpec(BaseModel):
    name: str
    risk: RiskClass
    description: str
    args_model: type[ToolArgs]

    def json_schema(self) -> dict:
        return self.args_model.model_json_schema()


TOOL_SPECS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in [
        ToolSpec(
            name="read_file",
            risk="read",
            description="Read a text file inside the workspace.",
            args_model=ReadFileArgs,
        ),
        ToolSpec(
            name="list_dir",
            risk="read",
            description="List the entries of a directory inside the workspace.",
            args_model=ListDirArgs,
        ),
        ToolSpec(
            name="write_file",
            risk="local-write",
            description="Create or overwrite a text file inside the workspace.",
            args_model=WriteFileArgs,
        ),
        ToolSpec(
            name="run_command",
            # Arbitrary commands can reach further, but v1 runs them confined to
            # the workspace with a scrubbed environment; issue #3 refines this.
            risk="local-write",
            description="Run a shell command in the workspace root (timeout, output capped).",
            args_model=RunCommandArgs,
        ),
        ToolSpec(
            name="http_get",
            risk="read",
            description="Fetch a URL with HTTP GET and return the start of the body.",
            args_model=HttpGetArgs,
        ),
    ]
}

DEFAULT_TOOLS: list[str] = list(TOOL_SPECS)
