"""A local HTTP server run from a daemon thread: the life cycle shared by the
scripted model server and the fake external services. No request handling here.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


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
            self._httpd = ThreadingHTTPServer((self._host, self._port), self.handler)
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
