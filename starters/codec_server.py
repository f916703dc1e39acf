"""`perdure codec-server`: Temporal's remote codec protocol over HTTP, so that the
Temporal UI and the `temporal` CLI of the people who hold the payload keys show
decrypted payloads, while the Temporal server itself only ever sees ciphertext.

    POST …/decode, POST …/encode   body and reply: protobuf JSON of `Payloads`,
                                   {"payloads": [{"metadata": {…}, "data": "…"}]}
    OPTIONS …                      CORS preflight, for the configured UI origins

Only the last path segment says which operation (the protocol lets an endpoint
sit under any prefix); a segment before it is read as the namespace, as the
CLI's `--codec-endpoint 'http://host:port/{namespace}'` template sends it. The
namespace (that segment, else the X-Namespace header the UI and CLI send) must
be one this server serves: another namespace may have other keys. With a bearer
token configured, every POST must carry `Authorization: Bearer <token>`
(`temporal … --codec-auth 'Bearer <token>'`); a preflight never carries it, so
it is never asked for one. Decoding uses runtime/codec.py's codec: payloads not
encrypted come back as they went in, and one under an unknown key fails the
request with a message naming the key id.

It holds the keys and nothing else: no Temporal connection, no stores, and it
logs requests without their payloads. Plain `http.server` in threads: the
crypto is synchronous and the traffic is one person's UI.
"""

from __future__ import annotations

import hmac
import json
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import structlog
from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads

from perdure.runtime.codec import DecryptionError, EncryptionCodec, Keyring

log = structlog.get_logger(__name__)

TOKEN_ENV = "PERDURE_CODEC_TOKEN"
ALLOWED_HEADERS = "authorization, content-type, x-namespace"
MAX_BODY_BYTES = 64 * 1024 * 1024
OPERATIONS = ("encode", "decode")


@dataclass(frozen=True)
class CodecServerConfig:
    host: str = "127.0.0.1"
    port: int = 8081
    origins: tuple[str, ...] = ()
    """Browser origins (scheme://host:port) whose pages may call the server: the Temporal UI's."""
    namespaces: tuple[str, ...] = ()
    """Namespaces served; empty serves any."""
    token: str | None = None


def origin_of(url: str) -> str:
    """scheme://host[:port] of a URL, as a browser sends it in the Origin header."""
    parts = urlsplit(url.strip())
    if not parts.scheme or not parts.netloc:
        raise ValueError(f"{url!r} is not a URL with a scheme and a host, such as http://localhost:8233")
    return f"{parts.scheme}://{parts.netloc}"


def ui_origins(ui_url: str) -> tuple[str, ...]:
    """The origins a browser may send for this UI: a loopback UI is reached as localhost or 127.0.0.1."""
    origin = origin_of(ui_url)
    parts = urlsplit(origin)
    if parts.hostname not in ("localhost", "127.0.0.1"):
        return (origin,)
    port = f":{parts.port}" if parts.port else ""
    return tuple(f"{parts.scheme}://{host}{port}" for host in ("localhost", "127.0.0.1"))


class CodecServer:
    """The HTTP server, on a thread of its own (`start`/`stop`) or in the foreground (`serve_forever`)."""

    def __init__(self, keyring: Keyring, config: CodecServerConfig) -> None:
        self.codec = EncryptionCodec(keyring)
        self.config = config
        self._http = ThreadingHTTPServer((config.host, config.port), _handler_for(self))
        self._http.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._http.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def serve_forever(self) -> None:
        self._http.serve_forever()

    def start(self) -> CodecServer:
        self._thread = threading.Thread(target=self._http.serve_forever, name="codec-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)
        self._thread = None


class RequestRefused(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _handler_for(server: CodecServer) -> type[BaseHTTPRequestHandler]:
    config = server.config

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "perdure-codec"
        # Headers and body go out in two writes: with Nagle's algorithm on, the body waits
        # for the client's delayed ACK (~40 ms a request; a history is one request per payload).
        disable_nagle_algorithm = True

        def do_OPTIONS(self) -> None:  # noqa: N802 (http.server's naming)
            self._reply(HTTPStatus.NO_CONTENT, b"")

        def do_POST(self) -> None:  # noqa: N802
            try:
                operation, namespace = self._route()
                self._authorize(namespace)
                payloads = self._payloads()
                if operation == "decode":
                    result = [server.codec.decrypt(p) for p in payloads.payloads]
                else:
                    result = [server.codec.encrypt(p) for p in payloads.payloads]
            except RequestRefused as refused:
                self._refuse(refused.status, str(refused))
                return
            except DecryptionError as err:
                self._refuse(HTTPStatus.UNPROCESSABLE_ENTITY, str(err))
                return
            body = json_format.MessageToJson(Payloads(payloads=result)).encode()
            self._reply(HTTPStatus.OK, body, "application/json")
            log.info("codec request", operation=operation, namespace=namespace, payloads=len(result))

        def do_GET(self) -> None:  # noqa: N802
            self._refuse(HTTPStatus.METHOD_NOT_ALLOWED, "use POST …/encode or POST …/decode")

        def _route(self) -> tuple[str, str | None]:
            segments = [s for s in urlsplit(self.path).path.split("/") if s]
            if not segments or segments[-1] not in OPERATIONS:
                raise RequestRefused(HTTPStatus.NOT_FOUND, "use POST …/encode or POST …/decode")
            from_path = segments[-2] if len(segments) >= 2 else None
            return segments[-1], from_path or self.headers.get("X-Namespace")

        def _authorize(self, namespace: str | None) -> None:
            if config.token is not None:
                sent = self.headers.get("Authorization", "")
                scheme, _, token = sent.partition(" ")
                if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), config.token):
                    raise RequestRefused(HTTPStatus.UNAUTHORIZED, "a valid Authorization: Bearer token is required")
            if config.namespaces and namespace not in config.namespaces:
                raise RequestRefused(
                    HTTPStatus.FORBIDDEN,
                    f"namespace {namespace!r} is not served here (serving: {', '.join(config.namespaces)})",
                )

        def _payloads(self) -> Payloads:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                raise RequestRefused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes")
            body = self.rfile.read(length)
            try:
                return json_format.Parse(body, Payloads())
            except (json_format.ParseError, UnicodeDecodeError) as err:
                reason = f"the body is not protobuf JSON of Payloads: {err}"
                raise RequestRefused(HTTPStatus.BAD_REQUEST, reason) from None

        def _refuse(self, status: HTTPStatus, message: str) -> None:
            # The body may be unread: close rather than read the next request out of it.
            self.close_connection = True
            self._reply(status, json.dumps({"error": message}).encode(), "application/json", close=True)
            log.info("codec request refused", path=self.path, status=int(status), reason=message)

        def _reply(self, status: HTTPStatus, body: bytes, content_type: str | None = None, close: bool = False) -> None:
            self.send_response(status)
            if close:
                self.send_header("Connection", "close")
            origin = self.headers.get("Origin")
            if origin and origin in config.origins:
                self.send_header("Access-Control-Allow-Origin", origin)
                self.send_header("Access-Control-Allow-Methods", "POST, OPTIONS")
                self.send_header("Access-Control-Allow-Headers", ALLOWED_HEADERS)
                # The UI's "include cross-origin credentials" setting sends cookies and needs this.
                self.send_header("Access-Control-Allow-Credentials", "true")
                self.send_header("Access-Control-Max-Age", "600")
            self.send_header("Vary", "Origin")
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
            # Requests are logged by do_POST through structlog, without payloads.
            pass

    return Handler
