"""Fixed payload keys for the tests that encrypt (the codec's, the object store's). Not a test module."""

from __future__ import annotations

import base64
import hashlib

from perdure.runtime.codec import Keyring, parse_keys


def fixed_key(key_id: str) -> str:
    """A fixed key per id (the same in every xdist worker, which collect the parameters apart)."""
    return f"{key_id}:{base64.b64encode(hashlib.sha256(key_id.encode()).digest()).decode()}"


KEY_A, KEY_B = fixed_key("key-a"), fixed_key("key-b")


def keyring(*entries: str) -> Keyring:
    return Keyring(parse_keys("\n".join(entries), "the test"))
