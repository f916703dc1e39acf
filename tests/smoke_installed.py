"""perdure as a user installs it: build the wheel and the sdist, install the wheel into a fresh
venv outside the checkout, and from a directory outside the checkout run `perdure --version`, the
dev server, a worker, a device, a goal whose plan uses every node kind (one step on the device)
under the offline profile, `perdure ui` and `perdure mcp`. A smoke, not the suite: `make
smoke-installed` (called by .ci/run after `make test`).

Only the installed `perdure` command and its public HTTP/MCP interfaces are driven, never an
internal module path (the wheel's contents are checked by name: only `perdure/` and its dist-info). Each step
prints its name; a failure names the step and exits 1.

Run: .venv/bin/python tests/smoke_installed.py [--keep]
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from contextlib import ExitStack
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
GOAL_ID = "smoke-every-kind"


class SmokeFailed(Exception):
    pass


def step(name: str) -> None:
    print(f"smoke: {name}", flush=True)


def run(argv: list[str], what: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as exc:
        raise SmokeFailed(f"{what}: timed out after {timeout:.0f} s ({' '.join(argv)})") from exc
    if done.returncode != 0:
        raise SmokeFailed(
            f"{what}: exit {done.returncode} ({' '.join(argv)})\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return done


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(log: Path, text: str, proc: subprocess.Popen, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            raise SmokeFailed(f"{what}: exited {proc.returncode} before '{text}':\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise SmokeFailed(f"{what}: no '{text}' within {timeout:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def get(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> str:
    """The body at url, once the server in proc answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return urllib.request.urlopen(url, timeout=30).read().decode()
        except OSError as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SmokeFailed(f"GET {url}: {exc}:\n{log.read_text()[-3000:]}") from exc
            time.sleep(0.3)


def build(out: Path) -> tuple[Path, Path]:
    step("build the wheel and the sdist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(CHECKOUT)], "build")
    wheel, sdist = next(out.glob("perdure-*.whl")), next(out.glob("perdure-*.tar.gz"))
    step("build a wheel from the sdist and compare its files")
    unpacked = out / "from-sdist"
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(unpacked), str(sdist)], "wheel from sdist")
    again = next(unpacked.glob("perdure-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist()) - {
        n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("RECORD")
    }
    names_again = {n for n in zipfile.ZipFile(again).namelist() if not n.endswith("RECORD")}
    if names != names_again:
        raise SmokeFailed(
            f"wheel from sdist differs: only in wheel {sorted(names - names_again)[:20]}, "
            f"only in sdist's {sorted(names_again - names)[:20]}"
        )
    return wheel, sdist


def install(wheel: Path, venv: Path) -> Path:
    step(f"install the wheel into a fresh venv ({venv})")
    run([sys.executable, "-m", "venv", str(venv)], "venv")
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], "pip install wheel", timeout=600)
    return venv / "bin"


def user_env(home: Path, port: int, ui_port: int) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PERDURE_", "TEMPORAL_", "PYTHON"))}
    keep = {k: v for k, v in keep.items() if not k.endswith("_API_KEY")}
    return {**keep, "PERDURE_HOME": str(home), "PERDURE_TEMPORAL": f"127.0.0.1:{port}",
            "PERDURE_UI": f"http://127.0.0.1:{ui_port}", "PERDURE_TASK_QUEUE": "smoke"}  # fmt: skip


def plan(device_root: Path) -> dict:
    """One step of every node kind the plan schema has, and one tool step on the device."""
    return {
        "goal": "Smoke every node kind",
        "steps": [
            {"name": "pause", "kind": "wait", "after": "1s"},
            {"name": "outline", "kind": "llm", "needs": ["pause"], "prompt": "Outline the notes."},
            {"name": "read", "kind": "tool", "tool": "read_file", "args": {"path": "notes.md"}},
            {
                "name": "remote",
                "kind": "tool",
                "tool": "read_file",
                "device": "smoke-box",
                "args": {"path": "remote.md"},
            },  # fmt: skip
            {
                "name": "tidy",
                "kind": "agent",
                "needs": ["outline", "read"],
                "tools": ["read_file", "write_file"],
                "prompt": "Read notes.md and write a tidy copy next to it.",
            },  # fmt: skip
            {
                "name": "part",
                "kind": "subgoal",
                "goal": "Do part one.",
                "plan": {"steps": [{"name": "sum", "kind": "llm", "prompt": "Sum up."}]},
            },  # fmt: skip
        ],
    }


def smoke(work: Path) -> None:
    wheel, _ = build(work / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("perdure/__init__.py", "perdure/workflows/goal/goal_workflow.py",
                   "perdure/workflows/goal/nodes/__init__.py", "perdure/activities/mcp/__init__.py",
                   "perdure/activities/models/scripts/demo.yaml", "perdure/starters/ui_assets/index.html",
                   "perdure/temporal_dev/dynamic-config.yaml"):  # fmt: skip
        if needed not in names:
            raise SmokeFailed(f"wheel contents: {needed} is missing from {wheel.name}")
    # One installed name: the package and its metadata, nothing else at the top of site-packages.
    tops = sorted({n.split("/")[0] for n in names} - {"perdure"})
    if len(tops) != 1 or not (tops[0].startswith("perdure-") and tops[0].endswith(".dist-info")):
        raise SmokeFailed(f"wheel contents: top-level names other than perdure/: {tops}")
    bin_ = install(wheel, work / "venv")
    outside = work / "cwd"
    outside.mkdir()
    perdure = str(bin_ / "perdure")

    step("the installed code is the venv's, not the checkout's")
    where = run([str(bin_ / "python"), "-c", "import perdure.workflows as w; print(w.__file__)"], "import", cwd=outside)
    site = str(work / "venv")
    if not where.stdout.strip().startswith(site) or "site-packages" not in where.stdout:
        raise SmokeFailed(f"import perdure.workflows: {where.stdout.strip()} is not in {site}'s site-packages")

    step("perdure --version")
    version = run([perdure, "--version"], "perdure --version", cwd=outside)
    if not version.stdout.startswith("perdure "):
        raise SmokeFailed(f"perdure --version: printed {version.stdout!r}")

    port, ui_port = free_port(), free_port()
    env = user_env(work / "home", port, ui_port)
    logs = work / "logs"
    logs.mkdir()
    with ExitStack() as stack:
        step("perdure server start")
        run([perdure, "server", "start", "--port", str(port), "--ui-port", str(ui_port)], "server start",
            cwd=outside, env=env, timeout=120)  # fmt: skip
        stack.callback(lambda: subprocess.run([perdure, "server", "stop"], cwd=outside, env=env, capture_output=True))

        def spawn(name: str, argv: list[str], ready: str | None) -> subprocess.Popen:
            log = logs / f"{name}.log"
            with open(log, "w") as out:
                proc = subprocess.Popen(argv, cwd=outside, env=env, stdout=out, stderr=subprocess.STDOUT)
            stack.callback(lambda: (proc.kill(), proc.wait()))
            if ready:
                wait_for(log, ready, proc, name)
            return proc

        step("perdure worker")
        spawn("worker", [perdure, "worker"], "polling")
        step("perdure device --name smoke-box")
        device_root = work / "device-root"
        device_root.mkdir()
        (device_root / "remote.md").write_text("# On the device\n")
        spawn("device", [perdure, "device", "--name", "smoke-box", "--root", str(device_root),
                         "--scratch", str(work / "scratch")], "device smoke-box online")  # fmt: skip

        step("a goal with every node kind, one step on the device (offline profile)")
        workspace = work / "project"
        workspace.mkdir()
        (workspace / "notes.md").write_text("# Notes\n\n- ship the export fix\n")
        plan_file = outside / "plan.json"
        plan_file.write_text(json.dumps(plan(device_root)))
        run([perdure, "start", "--plan", str(plan_file), "--workspace", str(workspace), "--id", GOAL_ID, "--watch"],
            "perdure start --watch", cwd=outside, env=env, timeout=240)  # fmt: skip
        result = run([perdure, "result", GOAL_ID], "perdure result", cwd=outside, env=env)
        text = " ".join(result.stdout.split())
        if "outcome: succeeded" not in text:
            raise SmokeFailed(f"perdure result: the goal did not succeed:\n{result.stdout[-3000:]}")
        if "On the device" not in text:
            raise SmokeFailed(f"perdure result: the device step's output is missing:\n{result.stdout[-3000:]}")

        step("perdure ui serves the page and the goal")
        page_port = free_port()
        ui = spawn("ui", [perdure, "ui", "--port", str(page_port)], None)
        base = f"http://127.0.0.1:{page_port}"
        page = get(base + "/", ui, logs / "ui.log")
        if "<html" not in page.lower():
            raise SmokeFailed(f"perdure ui: GET / is not the page: {page[:300]!r}")
        goals = get(base + "/api/goals", ui, logs / "ui.log")
        if GOAL_ID not in goals:
            raise SmokeFailed(f"perdure ui: GET /api/goals does not list {GOAL_ID}: {goals[:500]}")

        step("perdure mcp answers over stdio (list tools, goal_status)")
        client = work / "mcp_client.py"
        client.write_text(MCP_CLIENT)
        answered = run([str(bin_ / "python"), str(client), perdure, GOAL_ID], "perdure mcp", cwd=outside, env=env)
        if "goal_status ok" not in answered.stdout:
            raise SmokeFailed(f"perdure mcp: {answered.stdout[-2000:]}")


# Run by the fresh venv's Python: the official MCP client, installed with perdure.
MCP_CLIENT = """
import asyncio, json, os, sys
from mcp import Client
from mcp.client.stdio import StdioServerParameters

async def main(perdure, goal_id):
    params = StdioServerParameters(command=perdure, args=["mcp"], env=dict(os.environ))
    async with Client(params, read_timeout_seconds=60) as client:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert "goal_status" in tools, sorted(tools)
        result = await client.call_tool("goal_status", {"goal_id": goal_id})
        assert not result.is_error, result.content[0].text
        assert goal_id in json.dumps(result.structured_content), result.structured_content
        print("goal_status ok")

asyncio.run(main(*sys.argv[1:]))
"""


def main() -> int:
    keep = "--keep" in sys.argv
    work = Path(tempfile.mkdtemp(prefix="perdure-smoke-"))
    started = time.monotonic()
    try:
        smoke(work)
    except SmokeFailed as failure:
        print(f"smoke FAILED: {failure}", file=sys.stderr)
        print(f"(files kept in {work})", file=sys.stderr)
        return 1
    print(f"smoke: passed in {time.monotonic() - started:.0f} s")
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
