"""Creates the object-store buckets perdure's settings name: docker-compose.yml's one-shot
`bucket-setup` service runs it (`python -m perdure.starters.bucket_setup`) before any worker
starts, since a worker refuses a store whose bucket is missing.

The buckets are the artifact store's (PERDURE_ARTIFACT_STORE=s3://bucket/prefix) and, when
PERDURE_PAYLOAD_STORE names an s3:// store of its own, the payload store's; the store is
reached as a worker reaches it (runtime/s3_client.py: the standard AWS variables), so a run
that succeeds here means the workers' own check at start passes with the same variables.
Safe to run again: a bucket these credentials already own is left as it is.

It prints one line per bucket; anything that stops it is one line on stderr and exit
status 1, naming the store and the cause, never a credential. It touches no object and
never deletes anything.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from perdure.runtime import converter, settings
from perdure.runtime.s3_client import (
    ObjectStoreUnavailable,
    S3Location,
    check_bucket,
    endpoint,
    error_code,
    s3_client,
    unavailable,
)

# What a HEAD of a bucket that does not exist answers (a HEAD reply has no body, so no code word).
MISSING = ("404", "NoSuchBucket", "NotFound")
# What AWS answers a create for a bucket that exists: ours (nothing to do) or another account's.
OWNED = "BucketAlreadyOwnedByYou"
TAKEN = "BucketAlreadyExists"
# The one region whose buckets take no location constraint (AWS refuses it there).
DEFAULT_REGION = "us-east-1"


class NothingToCreate(ValueError):
    """The settings name no s3:// store, so there is no bucket to create."""


def buckets_named() -> dict[str, S3Location]:
    """What each store's bucket is, by store: the settings as workers read them."""
    named: dict[str, S3Location] = {}
    artifacts = settings.artifact_location()
    if isinstance(artifacts, S3Location):
        named["artifact store"] = artifacts
    if os.environ.get(converter.STORE_ENV, "").strip().startswith("s3://"):  # a bucket of its own
        payloads = converter.payload_location()
        assert isinstance(payloads, S3Location)
        named["payload store"] = payloads
    if not named:
        raise NothingToCreate(
            f"{settings.ARTIFACT_STORE_ENV} names no s3:// store "
            f"({os.environ.get(settings.ARTIFACT_STORE_ENV) or 'unset: the disk under PERDURE_HOME'}): "
            "there is no bucket to create"
        )
    return named


def ensure_bucket(client: Any, location: S3Location, what: str) -> bool:
    """Create `location`'s bucket unless it is there, then reach it as a worker does at start.
    True when it was created here."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.head_bucket(Bucket=location.bucket)
        return False
    except ClientError as err:
        if error_code(err) not in MISSING:
            raise unavailable(err, location, what, of_bucket=True) from None
    except BotoCoreError as err:
        raise unavailable(err, location, what, of_bucket=True) from None
    region = client.meta.region_name
    options = {} if region in (None, DEFAULT_REGION) else {"CreateBucketConfiguration": {"LocationConstraint": region}}
    try:
        client.create_bucket(Bucket=location.bucket, **options)
    except ClientError as err:
        code = error_code(err)
        if code == TAKEN:
            raise ObjectStoreUnavailable(
                f"the {what} {location.url} cannot be used: the bucket name {location.bucket!r} "
                "belongs to another account; choose another"
            ) from None
        # OWNED: another run made it since the look above, which is as good.
        if code != OWNED:
            raise unavailable(err, location, what, of_bucket=True) from None
    except BotoCoreError as err:
        raise unavailable(err, location, what, of_bucket=True) from None
    check_bucket(client, location, what)
    return True


def main() -> int:
    try:
        named = buckets_named()
        client = s3_client()
        at = endpoint() or "AWS S3"
        done: set[str] = set()
        for what, location in named.items():
            if location.bucket in done:
                print(f"{what} {location.url}: its bucket is the one above")
                continue
            created = ensure_bucket(client, location, what)
            done.add(location.bucket)
            print(
                f"{what} {location.url}: bucket {location.bucket!r} {'created' if created else 'already there'} at {at}"
            )
    except (ValueError, ObjectStoreUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
