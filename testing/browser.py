"""Headless Chromium (Debian's package) driven through its DevTools protocol, for tests that
click in perdure's page: open a URL, evaluate JavaScript in it, wait for a condition,
take a screenshot. Exceptions the page throws are collected in `errors`.

No browser download and no driver: Chromium is started with a debugging port on a
scratch profile, a page target is opened, and `Runtime.evaluate` runs expressions over
the target's websocket. What a test does in the page is what a person's click does
(`element.click()` fires the same listeners).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import websockets

CHROMIUM = Path("/usr/bin/chromium")


class BrowserError(RuntimeError):
    """The page raised, or a condition never held; the message says which."""


class Browser:
    def __init__(self, profile: Path) -> None:
        self._profile = profile
        self._proc: subprocess.Popen | None = None
        self._ws: Any = None
        self._ids = itertools.count(1)
        self.errors: list[str] = []
        """Uncaught exceptions of the page (read as the test talks to the browser)."""

    async def __aenter__(self) -> Browser:
        self._profile.mkdir(parents=True, exist_ok=True)
        flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-port=0",
            f"--user-data-dir={self._profile}",
            "about:blank",
        ]
        self._proc = subprocess.Popen([str(CHROMIUM), *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self._profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self._proc.poll() is not None:
                raise BrowserError("chromium did not open its debugging port")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        async with httpx.AsyncClient() as http:
            targets = (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
        page = next(t for t in targets if t.get("type") == "page")
        self._ws = await websockets.connect(page["webSocketDebuggerUrl"], max_size=None)
        await self._call("Runtime.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()

    async def _call(self, method: str, **params: Any) -> dict:
        call_id = next(self._ids)
        await self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(await self._ws.recv())
            if message.get("method") == "Runtime.exceptionThrown":
                details = message["params"]["exceptionDetails"]
                self.errors.append(details.get("exception", {}).get("description") or details.get("text", "?"))
            if message.get("id") == call_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message["result"]

    async def open(self, url: str) -> None:
        await self._call("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = await self._call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 30) -> Any:
        """The first truthy value of `expression`, polled every 0.1 s."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                value = await self.evaluate(expression)
            except BrowserError:
                value = None  # the page is still loading
            if value:
                return value
            await asyncio.sleep(0.1)
        raise BrowserError(f"never true in {timeout_s:g} s: {expression}")

    async def screenshot(self, path: Path, width: int = 1200, height: int = 760) -> int:
        """A PNG of the page at this viewport size, written to `path`; its size in bytes."""
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        await self._call("Emulation.setDeviceMetricsOverride", **metrics)
        shot = await self._call("Page.captureScreenshot", format="png")
        data = base64.b64decode(shot["data"])
        path.write_bytes(data)
        return len(data)
