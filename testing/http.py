"""The HTTP plumbing every test double here shares: a server run from a daemon thread,
and a JSON request handler that answers the way real APIs do (keep-alive, no Nagle delay).

What a double answers is its own business; nothing here knows a route or a wire format.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class _Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: a burst of a goal's parallel calls (hundreds of
    # writes at once) was refused at connect, which no real service of this kind does.
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client killed with its connection open (what crash tests do) resets it: nothing
        # went wrong here, and the stdlib's traceback on stderr would say otherwise.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class BackgroundHTTPServer:
    """Serves `handler` on host:port (0 = any free port) until stopped; handlers reach
    the owning object as `self.server.owner`."""

    handler: type[BaseHTTPRequestHandler]
    thread_name = "local-http"

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._port = port
        self._httpd: ThreadingHTTPServer | None = None

    def start(self) -> Self:
        if self._httpd is None:
            self._httpd = _Server((self._host, self._port), self.handler)
            self._httpd.daemon_threads = True
            self._httpd.owner = self  # type: ignore[attr-defined]
            self._port = self._httpd.server_address[1]
            # A short poll interval keeps stop() quick; tests start and stop many servers.
            threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=self.thread_name, daemon=True
            ).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self._port}"


class JSONHandler(BaseHTTPRequestHandler):
    """Answers with JSON bodies; the owning `BackgroundHTTPServer` keeps the record of
    what was served, so the stdlib's per-request log lines are silenced."""

    # Headers and body go out in two writes; with Nagle's algorithm on, the body waits
    # for the client's delayed ACK (~40 ms), which real APIs do not charge.
    disable_nagle_algorithm = True
    server: ThreadingHTTPServer
    # Keep-alive, as the real APIs: a client that keeps its connection pays no new handshake.
    protocol_version = "HTTP/1.1"

    def read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def read_whole_body(self) -> bytes | None:
        """The body, or None when the client went away before sending all of it (a call
        cancelled mid-request): a real server never hands such a request to its application."""
        expected = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(expected)
        if len(raw) < expected:
            self.close_connection = True
            return None
        return raw

    def send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The caller went away (a crash test killed it mid-call); what it asked for is recorded.
            pass

    def log_message(self, format: str, *args: Any) -> None:
        return


def serve_until_interrupted(*servers: BackgroundHTTPServer) -> None:
    """Block until Ctrl-C, then stop the servers: the `python -m` entry points of the doubles."""
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        for server in servers:
            server.stop()


class PingServer(BackgroundHTTPServer):
    """Counts the GETs that reach it: a command's network call, seen from outside."""

    def __init__(self) -> None:
        super().__init__()
        self.hits: list[str] = []

    class handler(JSONHandler):  # noqa: N801 (the attribute BackgroundHTTPServer serves)
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            self.server.owner.hits.append(self.path)  # type: ignore[attr-defined]
            self.send_json(200, {"pong": True})

        def log_message(self, *args: object) -> None:
            pass
