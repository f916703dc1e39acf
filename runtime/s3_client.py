"""The connection to an S3-compatible object store, for the artifact store
(activities/artifacts/s3_store.py) and the large-payload driver (runtime/converter.py).

Where the store is comes from perdure's settings as `s3://bucket/prefix`
(`S3Location`); how to reach it comes from the standard AWS variables, read by
boto3 itself in the worker and the CLI: AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL
(any S3-compatible server: MinIO, Ceph, R2, moto...), AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY (or the rest of boto3's credential chain: a profile, an
instance role), AWS_REGION or AWS_DEFAULT_REGION. None of them is copied anywhere:
not into workflow input or history, not into a log line, not into a process
perdure starts (commands and MCP servers get an environment built from scratch,
activities/tools/sandbox.py).

Failures to reach the store become `ObjectStoreUnavailable`, one line that names
the store and the cause (no bucket, credentials refused, endpoint down) and never
a credential. boto3 is imported when a client is first made, not with this module:
most CLI commands never touch the store.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from typing import Any

ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
REGION_ENVS = ("AWS_REGION", "AWS_DEFAULT_REGION")

# An object store answers in milliseconds; a host that takes the connection and never
# answers must not hang a worker's activity or a CLI command for boto3's 60 s default.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 30
# Retried inside the client, unlike model SDK calls (which activities retry): a put that
# fails after a paid model call would otherwise fail the activity and pay the call again.
# Every call here is idempotent (content-addressed keys), so a retry is always safe.
MAX_ATTEMPTS = 3

REFUSED_CREDENTIALS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken")

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class ObjectStoreUnavailable(RuntimeError):
    """The object store cannot be used: its bucket is missing, its credentials are refused, or
    its endpoint does not answer. The message is one line and names no credential."""


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key prefix (no leading or trailing slash; may be empty)."""

    bucket: str
    prefix: str = ""

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key(self, name: str) -> str:
        # The prefix is configuration, not part of a name: every reader needs the same value.
        return f"{self.prefix}/{name}" if self.prefix else name

    def under(self, sub: str) -> S3Location:
        return S3Location(self.bucket, self.key(sub))


def parse_s3_url(value: str, setting: str) -> S3Location:
    """`s3://bucket[/prefix]` as a location; ValueError naming `setting` otherwise."""
    bucket, _, prefix = value.strip().removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError(f"{setting}={value!r}: no bucket name after s3://")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ValueError(
            f"{setting}={value!r}: {bucket!r} is not a bucket name (3 to 63 lower-case letters, digits, '.' and '-')"
        )
    return S3Location(bucket, prefix.strip("/"))


def endpoint() -> str | None:
    """The S3-compatible endpoint the AWS variables name (None: AWS's own)."""
    return next((os.environ[name].strip() for name in ENDPOINT_ENVS if os.environ.get(name, "").strip()), None)


_clients: dict[tuple, Any] = {}
_clients_lock = threading.Lock()


def s3_client() -> Any:
    """A boto3 S3 client for the current AWS variables, made once per process and set of
    variables (boto3 clients are thread-safe; making one loads its service model: ~0.1 s)."""
    settings = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    with _clients_lock:
        client = _clients.get(settings)
        if client is None:
            client = _clients[settings] = _new_client()
        return client


def _new_client() -> Any:
    import boto3
    from botocore.config import Config

    url = endpoint()
    region = next((os.environ[name] for name in REGION_ENVS if os.environ.get(name)), None)
    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"mode": "standard", "total_max_attempts": MAX_ATTEMPTS},
        # S3-compatible servers (MinIO and most others) want path-style addressing: the
        # bucket in the path, not in a host name their DNS does not have.
        s3={"addressing_style": "path"} if url else {},
        # The digest check on every read guards the bytes; the newer default checksum
        # headers are refused by some S3-compatible servers.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    # A session of its own: boto3's default session is not safe to share between threads.
    return boto3.session.Session().client("s3", endpoint_url=url, region_name=region, config=config)


def is_not_found(err: BaseException) -> bool:
    """A 404 for an object (NoSuchKey, or HEAD's bodiless 404), not for the bucket."""
    code = error_code(err)
    return code in ("NoSuchKey", "404", "NotFound")


def error_code(err: BaseException) -> str | None:
    """The S3 error code of a botocore ClientError (NoSuchBucket, 404...), or None."""
    response = getattr(err, "response", None)
    if not isinstance(response, dict):
        return None
    return str(response.get("Error", {}).get("Code") or "") or None


def _status(err: BaseException) -> int | None:
    response = getattr(err, "response", None)
    return response.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(response, dict) else None


def unavailable(
    err: BaseException, location: S3Location, what: str, *, of_bucket: bool = False
) -> ObjectStoreUnavailable:
    """`err` from boto3 as one line: which store (`what`, at `location`), and why in words.
    `of_bucket`: the call was on the bucket (HEAD bucket), so a bodiless 404 is the bucket's.
    Built from the error's kind and code, never its text: a signature error's text quotes
    the request it signed."""
    from botocore import exceptions as boto

    at = f" at {endpoint()}" if endpoint() else ""
    code = error_code(err)
    if isinstance(err, boto.NoCredentialsError | boto.PartialCredentialsError):
        why = "no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or an AWS profile)"
    elif isinstance(err, boto.EndpointConnectionError | boto.ConnectTimeoutError | boto.ReadTimeoutError):
        why = f"the endpoint{at or ' (AWS S3)'} does not answer"
    elif code == "NoSuchBucket" or (of_bucket and code in ("404", "NotFound")):
        why = f"the bucket {location.bucket!r} does not exist{at}"
    elif code in (
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "TokenRefreshRequired",
    ):
        why = f"the credentials were refused ({code}){at}: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    elif code in ("AccessDenied", "403", "Forbidden", "AllAccessDisabled"):
        why = (
            f"access to bucket {location.bucket!r} was denied{at}: the store does not know these credentials "
            "or they lack permission for it (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
        )
    elif code is not None:
        why = f"the store answered {code} (HTTP {_status(err)}){at}"
    else:
        why = f"{type(err).__name__}{at}"
    return ObjectStoreUnavailable(f"the {what} {location.url} cannot be used: {why}")


def check_bucket(client: Any, location: S3Location, what: str) -> None:
    """Reach the bucket once (HEAD): ObjectStoreUnavailable saying why it cannot be used."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.head_bucket(Bucket=location.bucket)
    except (BotoCoreError, ClientError) as err:
        raise unavailable(err, location, what, of_bucket=True) from None
