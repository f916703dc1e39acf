"""A slow network link for tests: a TCP proxy on a free local port in front of a server
(moto's S3, a fake service), holding every piece of data a client sends for `delay_s`
before passing it on, as a remote store on a congested link answers late. Nothing is
patched: the client reaches the proxy over TCP as it would the server.

Threads, not the caller's event loop: the link is slow whatever the process under test
does with its own loop. Never used by a worker in production.
"""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit


class SlowLink:
    def __init__(self, upstream: str, delay_s: float) -> None:
        """`upstream`: the server's URL (http://host:port); `delay_s`: how long each piece a
        client sends waits before it is forwarded."""
        where = urlsplit(upstream)
        self.upstream = (where.hostname or "127.0.0.1", where.port or 80)
        self.delay_s = delay_s
        self.forwarded = 0
        """Pieces forwarded to the server so far (each one waited delay_s)."""
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SlowLink:
        threading.Thread(target=self._accept, name="slow-link", daemon=True).start()
        return self

    def stop(self) -> None:
        self._closed.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, server, self.delay_s), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, 0.0), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, delay_s: float) -> None:
        try:
            while data := source.recv(65536):
                if delay_s:
                    time.sleep(delay_s)
                    self.forwarded += 1
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()
