"""Tool activities against real files, real subprocesses and a real local HTTP server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from perdure.activities.artifacts import ArtifactStore, DiskArtifactStore
from perdure.activities.tools import fingerprints
from perdure.activities.tools.catalogue import TOOL_SPECS
from perdure.activities.tools.catalogue.file_tools import ReadFileArgs
from perdure.activities.tools.catalogue.tool_errors import ToolError
from perdure.activities.tools.command_runs import COMMAND_OUTPUT_CAP
from perdure.activities.tools.run_tool import ToolActivities
from perdure.activities.tools.sandbox import command_env
from perdure.activities.tools.workspace_files import read_file
from perdure.workflows.shared.contracts import ToolInput, ToolResult
from tests.subprocess_rig import marker_sleep, process_gone, process_running


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("alpha\n")
    (root / "b.txt").write_text("bravo")
    (tmp_path / "outside").mkdir()
    return root


async def run(
    store: ArtifactStore, ws: Path, tool: str, args: dict | None = None, *, env: ActivityEnvironment | None = None, **kw
) -> ToolResult:
    env = env or ActivityEnvironment()
    tool_input = ToolInput(goal_id="g1", node_key="n1", tool=tool, workspace=str(ws), args=args, **kw)
    return await env.run(ToolActivities(store).run_tool, tool_input)


def output_of(store: ArtifactStore, result: ToolResult) -> str:
    assert result.output is not None, result
    return store.get_text(result.output)


# --- file tools -------------------------------------------------------------------


async def test_read_file_returns_text_and_risk(store: ArtifactStore, ws: Path) -> None:
    result = await run(store, ws, "read_file", {"path": "docs/a.md"}, call_id="c7")
    assert result.ok and result.error is None
    assert result.tool == "read_file" and result.risk == "read" and result.call_id == "c7"
    assert output_of(store, result) == "alpha\n"
    assert result.preview == "alpha"


async def test_a_read_is_fingerprinted_from_its_own_open_without_reading_the_file_again(
    store: ArtifactStore, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def opened_again(*_args: object) -> str:
        raise AssertionError("the file was opened again to digest it")

    monkeypatch.setattr(fingerprints, "digest_of_source", opened_again)
    result = await run(store, ws, "read_file", {"path": "docs/a.md"})
    assert result.ok, result
    assert [(p.source, p.digest) for p in result.fingerprints] == [
        ("file:docs/a.md", "sha256:" + hashlib.sha256(b"alpha\n").hexdigest())
    ]


async def test_read_file_truncates_and_says_so(store: ArtifactStore, ws: Path) -> None:
    (ws / "big.txt").write_text("x" * 100)
    result = await run(store, ws, "read_file", {"path": "big.txt", "max_bytes": 10})
    assert result.ok
    assert output_of(store, result) == "x" * 10 + "\n[truncated: showing the first 10 of 100 bytes of 'big.txt']"


async def test_read_file_missing_is_data_for_the_model(store: ArtifactStore, ws: Path) -> None:
    result = await run(store, ws, "read_file", {"path": "nope.txt"})
    assert not result.ok and result.risk == "read"
    assert result.error == "'nope.txt' does not exist in the workspace"
    assert result.output is None


async def test_read_file_plain_function_without_temporal(ws: Path) -> None:
    assert await read_file(ws, ReadFileArgs(path="b.txt")) == "bravo"
    with pytest.raises(ToolError, match="is a directory"):
        await read_file(ws, ReadFileArgs(path="docs"))


async def test_list_dir_sorted_with_directory_suffix(store: ArtifactStore, ws: Path) -> None:
    (ws / "Zeta").mkdir()
    result = await run(store, ws, "list_dir", {})
    assert result.ok and result.risk == "read"
    assert output_of(store, result) == "Zeta/\nb.txt\ndocs/"
    sub = await run(store, ws, "list_dir", {"path": "docs"})
    assert output_of(store, sub) == "a.md"


async def test_write_file_overwrites_and_creates_parents(store: ArtifactStore, ws: Path) -> None:
    first = await run(store, ws, "write_file", {"path": "out/deep/r.md", "content": "first version, long"})
    assert first.ok and first.risk == "local-write"
    assert output_of(store, first) == "wrote 19 bytes to out/deep/r.md"
    second = await run(store, ws, "write_file", {"path": "out/deep/r.md", "content": "héllo"})
    assert output_of(store, second) == "wrote 6 bytes to out/deep/r.md"
    assert (ws / "out" / "deep" / "r.md").read_text() == "héllo"
    # No temp files left behind next to it.
    assert sorted(p.name for p in (ws / "out" / "deep").iterdir()) == ["r.md"]


async def test_write_file_escape_writes_nothing_outside(store: ArtifactStore, ws: Path, tmp_path: Path) -> None:
    (ws / "link").symlink_to(tmp_path / "outside", target_is_directory=True)
    traversal = await run(store, ws, "write_file", {"path": "../outside/x.txt", "content": "pwned"})
    assert not traversal.ok and traversal.risk == "local-write"
    assert traversal.error == "'../outside/x.txt' contains '..'; paths must stay inside the workspace"
    via_link = await run(store, ws, "write_file", {"path": "link/sub/x.txt", "content": "pwned"})
    assert not via_link.ok
    assert "outside the workspace (via a symlink)" in (via_link.error or "")
    absolute = await run(store, ws, "write_file", {"path": str(tmp_path / "outside" / "y.txt"), "content": "pwned"})
    assert not absolute.ok and "is absolute" in (absolute.error or "")
    assert list((tmp_path / "outside").iterdir()) == []


async def test_missing_workspace_is_a_goal_level_error(store: ArtifactStore, tmp_path: Path) -> None:
    with pytest.raises(ApplicationError) as err:
        await run(store, tmp_path / "no-such-ws", "read_file", {"path": "a"})
    assert err.value.type == "WorkspaceMissing"
    assert err.value.non_retryable


# --- arguments and templates --------------------------------------------------------


async def test_missing_field_names_tool_and_field(store: ArtifactStore, ws: Path) -> None:
    result = await run(store, ws, "write_file", {"path": "x.txt"})
    assert not result.ok and result.risk == "local-write"
    assert result.error == (
        "bad arguments for write_file: content: Field required; expected fields: path (required), content (required), "
        "base_version"
    )
    assert not (ws / "x.txt").exists()


async def test_extra_field_is_rejected(store: ArtifactStore, ws: Path) -> None:
    result = await run(store, ws, "read_file", {"path": "b.txt", "encoding": "latin-1"})
    assert not result.ok
    assert "bad arguments for read_file: encoding: Extra inputs are not permitted" in (result.error or "")


async def test_args_ref_from_a_model(store: ArtifactStore, ws: Path) -> None:
    ref = store.put_text(json.dumps({"path": "b.txt"}), "application/json")
    result = await run(store, ws, "read_file", args_ref=ref, call_id="call_1")
    assert result.ok and result.call_id == "call_1"
    assert output_of(store, result) == "bravo"


async def test_malformed_json_args_ref(store: ArtifactStore, ws: Path) -> None:
    ref = store.put_text('{"path": "b.txt",', "application/json")
    result = await run(store, ws, "read_file", args_ref=ref)
    assert not result.ok and result.risk == "read"
    assert (result.error or "").startswith("arguments for read_file are not valid JSON: ")
    not_object = await run(store, ws, "read_file", args_ref=store.put_text('["b.txt"]'))
    assert not_object.error == "arguments for read_file must be a JSON object, got list"


async def test_unknown_tool(store: ArtifactStore, ws: Path) -> None:
    result = await run(store, ws, "rm_rf", {})
    assert not result.ok and result.risk is None
    known = ToolActivities(store).tools
    assert result.error == f"unknown tool 'rm_rf' (known: {', '.join(sorted(known))})"


async def test_templates_resolved_from_step_outputs(store: ArtifactStore, ws: Path) -> None:
    summary = store.put_text("the summary")
    title = store.put_text("Title")
    result = await run(
        store,
        ws,
        "write_file",
        {"path": "report.md", "content": "# {{steps.title}}\n\n{{ steps.summary }} / {{steps.summary}}"},
        inputs={"summary": summary, "title": title},
    )
    assert result.ok, result.error
    assert (ws / "report.md").read_text() == "# Title\n\nthe summary / the summary"


async def test_template_naming_a_step_not_passed(store: ArtifactStore, ws: Path) -> None:
    result = await run(
        store, ws, "write_file", {"path": "r.md", "content": "{{steps.ghost}}"}, inputs={"real": store.put_text("x")}
    )
    assert not result.ok
    assert result.error == (
        "argument uses {{steps.ghost}} but no output of step 'ghost' was passed to this tool call (available: real)"
    )
    assert not (ws / "r.md").exists()


async def test_template_whose_artifact_is_gone_is_goal_level(store: ArtifactStore, ws: Path) -> None:
    other = DiskArtifactStore(ws.parent / "other-store")
    lost = other.put_text("only elsewhere")
    with pytest.raises(ApplicationError) as err:
        await run(store, ws, "write_file", {"path": "r.md", "content": "{{steps.a}}"}, inputs={"a": lost})
    assert err.value.type == "ArtifactMissing" and err.value.non_retryable


async def test_model_written_args_are_literal(store: ArtifactStore, ws: Path) -> None:
    """A model writing a template-looking string gets exactly what it wrote."""
    ref = store.put_text(json.dumps({"path": "t.md", "content": "use {{steps.summary}} here"}), "application/json")
    result = await run(store, ws, "write_file", args_ref=ref, inputs={"summary": store.put_text("SECRET")})
    assert result.ok, result.error
    assert (ws / "t.md").read_text() == "use {{steps.summary}} here"


def test_every_spec_has_an_implementation(store: ArtifactStore) -> None:
    assert set(ToolActivities(store).tools) == set(TOOL_SPECS)


# --- read_artifact ----------------------------------------------------------------------


async def test_read_artifact_returns_an_output_in_full_by_digest(store: ArtifactStore, ws: Path) -> None:
    text = "line\n" * 3000
    ref = store.put_text(text)
    result = await run(store, ws, "read_artifact", {"digest": ref.digest})
    assert result.ok and result.risk == "read"
    assert output_of(store, result) == text
    capped = await run(store, ws, "read_artifact", {"digest": ref.digest, "max_bytes": 10})
    assert output_of(store, capped).startswith("line\nline\n\n[truncated: showing the first 10 of 15000 bytes")


async def test_read_artifact_says_what_is_wrong_with_a_digest(store: ArtifactStore, ws: Path) -> None:
    missing = await run(store, ws, "read_artifact", {"digest": "sha256:" + "0" * 64})
    assert not missing.ok and "no output with digest sha256:000" in (missing.error or "")
    malformed = await run(store, ws, "read_artifact", {"digest": "abc"})
    assert not malformed.ok and "digest" in (malformed.error or "") and "pattern" in (malformed.error or "")
    binary = await run(store, ws, "read_artifact", {"digest": store.put_bytes(b"\x00\x01").digest})
    assert not binary.ok and "binary" in (binary.error or "")


# --- run_command ----------------------------------------------------------------------


async def test_run_command_success_reports_exit_code(store: ArtifactStore, ws: Path) -> None:
    result = await run(store, ws, "run_command", {"command": "cat b.txt; echo; echo err >&2; pwd"})
    assert result.ok and result.risk == "local-write"
    assert output_of(store, result) == (
        f"$ cat b.txt; echo; echo err >&2; pwd\nbravo\nerr\n{ws.resolve()}\n\n[exit code 0]"
    )


async def test_run_command_nonzero_exit_is_data_with_output(store: ArtifactStore, ws: Path) -> None:
    result = await run(store, ws, "run_command", {"command": "echo building; echo 'boom: missing dep' >&2; exit 3"})
    assert not result.ok
    assert result.error == "command exited with 3; output:\nbuilding\nboom: missing dep"
    assert output_of(store, result).endswith("boom: missing dep\n\n[exit code 3]")


async def test_run_command_caps_output(store: ArtifactStore, ws: Path) -> None:
    result = await run(store, ws, "run_command", {"command": "head -c 200000 /dev/zero | tr '\\0' a; echo; echo END"})
    assert result.ok
    text = output_of(store, result)
    assert len(text.encode()) < COMMAND_OUTPUT_CAP + 500
    assert "bytes of output omitted]" in text
    omitted = 200_000 + 1 + 4 - COMMAND_OUTPUT_CAP
    assert f"[truncated: {omitted} of 200005 bytes of output omitted]" in text
    assert text.endswith("a\nEND\n\n[exit code 0]")


@pytest.mark.slow
async def test_run_command_timeout_kills_the_process_group(store: ArtifactStore, ws: Path) -> None:
    background = marker_sleep()
    started = time.monotonic()
    result = await run(
        store, ws, "run_command", {"command": f"{background} & echo started; {marker_sleep()}", "timeout_s": 1}
    )
    elapsed = time.monotonic() - started
    assert elapsed < 8, elapsed
    assert not result.ok
    assert result.error == "timed out after 1s; output:\nstarted"
    assert "[killed: timed out after 1s]" in output_of(store, result)
    assert process_gone(background), "the background sleep outlived the timeout"


async def test_run_command_kills_leftover_background_processes(store: ArtifactStore, ws: Path) -> None:
    background = marker_sleep()
    started = time.monotonic()
    result = await run(store, ws, "run_command", {"command": f"{background} & echo done", "timeout_s": 20})
    assert result.ok, result.error
    assert time.monotonic() - started < 8
    assert process_gone(background)


async def test_run_command_environment_is_scrubbed(
    store: ArtifactStore, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("PERDURE_SOME_TOKEN", "tok-123")
    result = await run(store, ws, "run_command", {"command": "env"})
    assert result.ok
    text = output_of(store, result)
    assert "sk-secret" not in text and "OPENAI_API_KEY" not in text and "tok-123" not in text
    assert f"HOME={ws.resolve()}" in text and "TERM=dumb" in text
    names = {line.split("=", 1)[0] for line in text.splitlines()[1:] if "=" in line}
    assert names <= set(command_env(ws)) | {"PWD", "SHLVL", "_", "OLDPWD"}, names


@pytest.mark.slow
async def test_run_command_heartbeats_while_waiting(
    store: ArtifactStore, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("perdure.activities.tools.command_runs.HEARTBEAT_EVERY_S", 0.1)
    env = ActivityEnvironment()
    beats: list[tuple] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    result = await run(store, ws, "run_command", {"command": "sleep 0.6"}, env=env)
    assert result.ok
    assert len(beats) >= 3, beats
    assert all(str(d[0]).startswith("running for ") for d in beats)


async def test_cancelled_activity_kills_the_process_group(store: ArtifactStore, ws: Path) -> None:
    background = marker_sleep()
    env = ActivityEnvironment()
    task = asyncio.create_task(
        run(store, ws, "run_command", {"command": f"{background} & touch started; {marker_sleep()}"}, env=env)
    )
    for _ in range(100):
        if (ws / "started").exists() and process_running(background):
            break
        await asyncio.sleep(0.05)
    assert process_running(background), "the background sleep never started"
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert process_gone(background)


# --- http_get -------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path == "/hello":
            self._send(200, b"hello from the test server")
        elif self.path == "/big":
            self._send(200, b"0123456789" * 100)
        elif self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/hello")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._send(404, b"no such page")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output clean


@pytest.fixture(scope="module")
def http_base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


async def test_http_get_200(store: ArtifactStore, ws: Path, http_base: str) -> None:
    result = await run(store, ws, "http_get", {"url": f"{http_base}/hello"})
    assert result.ok and result.risk == "read"
    assert output_of(store, result) == "hello from the test server"


async def test_http_get_follows_redirects(store: ArtifactStore, ws: Path, http_base: str) -> None:
    result = await run(store, ws, "http_get", {"url": f"{http_base}/moved"})
    assert result.ok
    assert output_of(store, result) == "hello from the test server"


async def test_http_get_caps_body(store: ArtifactStore, ws: Path, http_base: str) -> None:
    result = await run(store, ws, "http_get", {"url": f"{http_base}/big", "max_bytes": 25})
    assert result.ok
    assert output_of(store, result) == (
        f"0123456789012345678901234\n[truncated: showing the first 25 bytes of {http_base}/big]"
    )


async def test_http_get_404_is_data(store: ArtifactStore, ws: Path, http_base: str) -> None:
    result = await run(store, ws, "http_get", {"url": f"{http_base}/missing"})
    assert not result.ok and result.risk == "read"
    assert result.error == f"GET {http_base}/missing returned HTTP 404; body starts: no such page"


async def test_http_get_network_error_is_data(store: ArtifactStore, ws: Path) -> None:
    result = await run(store, ws, "http_get", {"url": "http://127.0.0.1:9/"})
    assert not result.ok
    assert (result.error or "").startswith("GET http://127.0.0.1:9/ failed: ConnectError")


async def test_http_get_needs_no_workspace(store: ArtifactStore, tmp_path: Path, http_base: str) -> None:
    result = await run(store, tmp_path / "not-on-this-machine", "http_get", {"url": f"{http_base}/hello"})
    assert result.ok


async def test_http_get_rejects_non_http_url(store: ArtifactStore, ws: Path) -> None:
    result = await run(store, ws, "http_get", {"url": "file:///etc/passwd"})
    assert not result.ok
    assert "bad arguments for http_get: url: String should match pattern" in (result.error or "")


async def test_both_args_and_args_ref_is_a_workflow_bug(store: ArtifactStore, ws: Path) -> None:
    with pytest.raises(ApplicationError) as err:
        await run(store, ws, "read_file", {"path": "b.txt"}, args_ref=store.put_text('{"path": "b.txt"}'))
    assert err.value.type == "BadToolInput" and err.value.non_retryable


async def test_read_file_refuses_binary(store: ArtifactStore, ws: Path) -> None:
    (ws / "blob.bin").write_bytes(b"PK\x03\x04\x00\x00binary")
    result = await run(store, ws, "read_file", {"path": "blob.bin"})
    assert not result.ok
    assert result.error == "'blob.bin' looks like a binary file (it contains NUL bytes); read_file returns text only"
