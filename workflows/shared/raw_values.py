"""A signal's raw arguments decoded in workflow code without ever failing its task: whatever
bytes anyone sends under a handler's name (the goal's inbox, the router) become values or the
reason they could not. Workflow code (it uses the workflow's payload converter)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue

from perdure.workflows.goal.contracts.messages import bounded


def decode_raw(args: Sequence[RawValue]) -> tuple[list[Any], str | None]:
    """(values, None), or ([], why argument N could not be decoded)."""
    converter = workflow.payload_converter()
    values = []
    for position, raw in enumerate(args, start=1):
        try:
            values.append(converter.from_payload(raw.payload))
        except Exception as err:  # whatever the bytes are, the workflow goes on
            encoding = raw.payload.metadata.get("encoding", b"").decode(errors="replace") or "none"
            return [], bounded(f"argument {position} could not be decoded (encoding {encoding}): {err}")
    return values, None
