"""A real S3-compatible server on this machine for tests and benchmarks: moto's server
(`moto_server`, from the `moto[server]` package of the dev extras) as a subprocess on a
free local port, speaking S3's HTTP API, so perdure's boto3 client reaches it exactly as
it reaches AWS S3 or MinIO. Not an in-process mock: nothing is patched.

`env()` gives the standard AWS variables a worker or the CLI needs to use it; `bucket()`
makes a fresh bucket; `objects()` lists one as an operator would (keys and bytes).
Never used by a worker in production.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from perdure.testing.servers import free_ports

ACCESS_KEY = "AKIAPERDURETESTING00"
SECRET_KEY = "perdure-test-secret-key-never-real-0000"
REGION = "us-east-1"


class S3Server:
    def __init__(self, log: Path | None = None, *, check_credentials: bool = False) -> None:
        """`check_credentials`: the server refuses access keys it does not know (moto's IAM
        authentication, on from the first request), as a real store does."""
        self.log = log
        self.check_credentials = check_credentials
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30) -> S3Server:
        (self.port,) = free_ports(1)
        moto = Path(sys.executable).parent / "moto_server"
        variables = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        if self.check_credentials:
            variables["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen(
            [str(moto), "-H", "127.0.0.1", "-p", str(self.port)],
            env=variables,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"moto_server did not start on port {self.port}")
            time.sleep(0.1)
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def env(self) -> dict[str, str]:
        """The AWS variables that point boto3 (perdure's, or any other) at this server."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            # Without credentials boto3 would ask the EC2 metadata address, which is not this machine.
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        """An S3 client of its own (not perdure's): what an operator's tool sees."""
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def bucket(self, prefix: str = "perdure") -> str:
        """A new, empty bucket."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under `prefix` in `bucket`: key -> bytes."""
        client = self.client()
        found: dict[str, bytes] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                found[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        return found
