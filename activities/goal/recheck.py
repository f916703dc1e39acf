"""Checking finished work again before a goal goes on after a long wait: one activity,
`perdure.verify.nodes`, that says which of the nodes it is given no longer hold, and why
(and digests the files a goal looks at around its command steps: `look_at`); and the
model question a step's `verify` may ask, `perdure.model.verify_question`.

Per node, as deep as its check asks: existence (its output artifact is in the store,
the files it wrote are in the workspace), fingerprint (the files and directories it
read digest as they did when it read them, the URLs it fetched return what they
returned), semantic (its `verify` command, run in the same sandbox as every shell
command, exits as expected). The first failing check of a node is its reason; every
read that changed is also listed (a question's evidence). Nothing here changes the
workspace or the goal.

URLs are re-fetched by the http_get tool itself (activities/tools/http_calls.py: the same URL
rules, client, redirects, cap and decoding), under the tool's own rule: when the goal
may call http_get, whatever its `allow_network` (which is about shell commands). A
fetch that fails (unreachable, a timeout, an HTTP error status) keeps the step and says
so: a flaky network must not void a goal's work, and only a body that was read and
differs voids. Reasons show a URL without its query and user info: the record goes to
the gate log and the plan history, where a token in a query must not be copied.

The question: the model is shown the goal, the step's question, its conclusion (the
output artifact read here in full, up to MAX_CONCLUSION_CHARS: the workflow holds only
a 200-character preview, too little to judge a conclusion by) and what the goal
learned since. Its answer's first non-blank line must be exactly `HOLDS` or `VOID:
<reason>`; anything else is "unjudged" and keeps the step (`parse_verdict`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError
from temporalio import activity

from perdure.activities.artifacts import ArtifactCorrupt, ArtifactMissing, ArtifactStore, preview
from perdure.activities.heartbeat import Heartbeat
from perdure.activities.models.model_activities import ModelActivities, cap, constraints_block, goal_message
from perdure.activities.models.providers import ChatMessage, ChatRequest
from perdure.activities.tools import sandbox
from perdure.activities.tools.catalogue.command_tool import RunCommandArgs
from perdure.activities.tools.catalogue.http_tools import HttpGetArgs
from perdure.activities.tools.catalogue.tool_errors import ToolError
from perdure.activities.tools.command_runs import run_command
from perdure.activities.tools.fingerprints import URL_PREFIX, digest_of_source, url_cap, url_digest
from perdure.activities.tools.http_calls import http_get
from perdure.workflows.goal.contracts.goal_contracts import Activities
from perdure.workflows.goal.contracts.verify_contracts import (
    NodeCheck,
    QuestionInput,
    QuestionResult,
    VerdictKind,
    VerifyInput,
    VerifyResult,
)
from perdure.workflows.shared.contracts import Fingerprint

# The marker lets the scripted server (and a person reading a transcript) tell the call apart.
VERIFY_MARKER = "PERDURE-VERIFY"
MAX_CONCLUSION_CHARS = 16_000
MAX_REASON_CHARS = 300


class VerificationActivities:
    def __init__(self, store: ArtifactStore) -> None:
        self.store = store

    @activity.defn(name=Activities.VERIFY_NODES)
    async def verify_nodes(self, input: VerifyInput) -> VerifyResult:
        root = Path(input.workspace)
        result = VerifyResult(checked=len(input.checks))
        if input.look_at:
            result.looked = await asyncio.to_thread(_looked_at, root, input.look_at)
        async with Heartbeat(lambda: f"checking {len(input.checks)} finished steps"):
            for check in input.checks:
                await self._check(root, check, input, result)
        return result

    async def _check(self, root: Path, check: NodeCheck, input: VerifyInput, result: VerifyResult) -> None:
        """The first reason `check.node` no longer holds goes to `result.void`; every read
        that changed to `result.changed`; what could not be checked to `result.unchecked`."""
        if check.depth == "trust":
            return
        reasons: list[str] = []
        notes: list[str] = []
        for ref in check.artifacts:
            if not await self.store.ahas(ref):
                reasons.append(f"its output {ref.digest[:19]} is no longer in the artifact store")
        urls = []
        for print_ in check.fingerprints:
            if print_.source.startswith(URL_PREFIX):
                if print_.kind == "read" and check.depth != "existence":
                    urls.append(print_)
                continue
            path = print_.source.partition(":")[2]
            now = await asyncio.to_thread(digest_of_source, root, print_.source)
            if print_.kind == "wrote" and now is None:
                reasons.append(f"{path}, which it wrote, is gone")
            if print_.kind == "read" and check.depth != "existence" and now != print_.digest:
                said = f"{path} {'is gone' if now is None else 'changed'} since it was read"
                reasons.append(said)
                result.changed.append(f"{said} (by step '{check.node}')")
        for print_ in urls:
            if reasons:
                break  # void already: no request to learn what is not needed
            if not input.refetches():
                notes.append(f"{shown_url(print_.source)} not re-fetched (the goal does not allow http_get)")
                continue
            changed, note = await self._url_changed(print_)
            if note:
                notes.append(note)
            elif changed:
                reasons.append(changed)
                result.changed.append(f"{changed} (by step '{check.node}')")
        if not reasons and check.depth == "semantic" and check.command:
            failing = await self._command_fails(root, check, input.network)
            if failing:
                reasons.append(failing)
        if reasons:
            result.void[check.node] = reasons[0]
        if notes:
            result.unchecked[check.node] = "; ".join(notes)[:MAX_REASON_CHARS]

    async def _url_changed(self, print_: Fingerprint) -> tuple[str | None, str | None]:
        """(why it no longer holds, None), (None, why it could not be re-fetched), or (None, None)."""
        url = print_.source.removeprefix(URL_PREFIX)
        shown = shown_url(print_.source)
        try:
            args = HttpGetArgs(url=url, max_bytes=url_cap(print_.digest))
            text = await http_get(Path("."), args)
        except ValidationError:
            return None, f"{shown} not re-fetched (not a URL http_get takes)"
        except ToolError as err:
            why = err.message.partition("; body starts:")[0].replace(url, shown)
            return None, f"{shown} could not be re-fetched ({preview(why, 160)})"
        if url_digest(text, args.max_bytes) != print_.digest:
            return f"{shown} returns another body than when it was fetched", None
        return None, None

    async def _command_fails(self, root: Path, check: NodeCheck, network: bool) -> str | None:
        assert check.command is not None
        args = RunCommandArgs(command=check.command, timeout_s=check.timeout_s, replay="safe")
        hidden = tuple(sandbox.hidden_paths(self.store.local_dir))
        try:
            await run_command(root, args, network=network, hidden=hidden)
            code = 0
        except ToolError as err:
            code = _exit_code(err.output or "")
            if code is None:
                return f"its check `{check.command}` could not run: {err.message[:200]}"
        if code != check.expect_exit:
            return f"its check `{check.command}` exited {code}, expected {check.expect_exit}"
        return None


class VerifyQuestionActivities(ModelActivities):
    """The model question of a step's `verify`: one call, its answer read strictly.
    Register `VerifyQuestionActivities(config, store).activities()` with the worker."""

    def activities(self) -> list[Callable[..., Any]]:
        return [self.verify_question]

    @activity.defn(name=Activities.VERIFY_QUESTION)
    async def verify_question(self, input: QuestionInput) -> QuestionResult:
        messages = [
            ChatMessage(role="system", content=question_system_prompt(input.context.constraints)),
            ChatMessage(role="user", content=await self._question_message(input)),
        ]
        async with self._attempt(input.context, f"verify question {input.step}") as attempt:
            response, usage = await self._chat(input.context, ChatRequest(messages=messages), attempt)
            verdict, reason = parse_verdict(response.text)
            activity.logger.info("verify question answered", extra={"step": input.step, "verdict": verdict})
            return attempt.result(QuestionResult(verdict=verdict, reason=reason, usage=usage, model=response.model))

    async def _question_message(self, input: QuestionInput) -> str:
        conclusion = input.preview or "(empty)"
        if input.output is not None:
            try:
                conclusion = cap(await self.store.aget_text(input.output), MAX_CONCLUSION_CHARS)
            except (ArtifactMissing, ArtifactCorrupt):
                conclusion = f"{conclusion}\n[only its start: the full output cannot be read]"
        finished = f", finished {input.finished_at.isoformat(timespec='seconds')}" if input.finished_at else ""
        since = "\n".join(f"- {c}" for c in input.conclusions) or "(none)"
        changed = "\n".join(f"- {c}" for c in input.changed) or "(none found)"
        return f"verify: {input.step}\n\n" + goal_message(
            input.context,
            f"Question about step '{input.step}':\n{input.question}",
            f"--- the step's conclusion (its output{finished}) ---\n{conclusion}\n--- end of the conclusion ---",
            f"Conclusions the goal recorded after this step finished:\n{since}",
            f"Files and URLs the goal read that are not as they were read:\n{changed}",
            "Answer with a first line that is exactly `HOLDS` or `VOID: <one-line reason>`.",
        )


def question_system_prompt(constraints: list[str]) -> str:
    return "\n\n".join(
        [
            f"[{VERIFY_MARKER}]\nYou check one finished step of a long-running goal after the goal waited "
            "a long time. Given the goal, the step's question, the step's conclusion and what the goal has "
            "learned since, decide whether the conclusion still holds.",
            constraints_block(constraints),
            "Reply with a first line that is exactly `HOLDS` if the conclusion still holds, or `VOID: ` and "
            "a one-line reason if it no longer does. You may explain on the lines after it.",
        ]
    )


def parse_verdict(text: str) -> tuple[VerdictKind, str]:
    """(verdict, reason) of a question's answer. Only two forms count, on the first
    non-blank line: exactly `HOLDS`, or `VOID:` and a reason. Anything else, however
    close, is unjudged: the step is kept (a garbled answer must not void work)."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first == "HOLDS":
        return "holds", "the model judged it still holds"
    reason = first.removeprefix("VOID:").strip() if first.startswith("VOID:") else ""
    if reason:
        return "void", reason[:MAX_REASON_CHARS]
    return "unjudged", f"its answer did not parse: {preview(text, 120) or '(empty)'!r}"


def shown_url(source: str) -> str:
    """A URL (or `url:URL`) as reasons show it: without user info, query or fragment."""
    url = source.removeprefix(URL_PREFIX)
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return preview(url.partition("?")[0], 120)
    query = "?…" if parts.query else ""
    return preview(urlunsplit((parts.scheme, host + port, parts.path, "", "")) + query, 160)


def _looked_at(root: Path, sources: list[str]) -> list[Fingerprint]:
    return [
        Fingerprint(kind="seen", source=source, digest=digest_of_source(root, source), at=datetime.now(UTC))
        for source in sources
    ]


def _exit_code(output: str) -> int | None:
    """The exit code run_command's output ends with (`[exit code N]`), None if it did not exit."""
    tail = output.rstrip().rpartition("[exit code ")[2]
    number = tail.removesuffix("]")
    return int(number) if tail.endswith("]") and number.isdigit() else None
