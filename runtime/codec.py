"""Encryption of everything perdure keeps: payloads in Temporal's history (a
`PayloadCodec`) and the files at rest (artifacts, offloaded payloads), all with
AES-256-GCM under one set of keys. Off unless keys are configured; this module
reads the keys and does the cryptography, and decides nothing about where data
goes.

PERDURE_PAYLOAD_KEYS      id:base64key[,id:base64key...], newest last: new data is
                          encrypted with the newest key, older ones only decrypt
PERDURE_PAYLOAD_KEY_FILE  a file of the same entries, one per line (blank lines
                          and `#` comments allowed); used when PERDURE_PAYLOAD_KEYS
                          is not set
A key is 32 random bytes in base64 (`openssl rand -base64 32`); an id is 1 to 64
of A-Z a-z 0-9 . _ - and is written next to every ciphertext, so a key can be
rotated: add a new one last, and keep the old ones for as long as anything
encrypted with them is still read. Workers, the CLI, replayers and the codec
server need the same keys; they never reach workflow input, history or a tool.

The codec turns a payload into one whose metadata is `encoding: binary/encrypted`
and `encryption-key-id: <id>` and whose data is nonce + ciphertext of the whole
serialized payload (metadata included: the encoding of the plaintext is secret
too). Decoding passes through every payload without that encoding, so histories
written before encryption was on (the golden histories in tests/histories/)
still replay, and a payload whose key id is not configured fails with
`UnknownPayloadKey`, naming the id.

Order with the payload store (runtime/converter.py): the SDK runs the codec
first and external storage after it, on outbound payloads, and the reverse on
inbound ones. That is the order wanted here: the store is handed ciphertext, so
an offloaded payload is encrypted at rest with nothing more, the size threshold
applies to what really travels, and the small reference left in history names a
digest and a size, no content. The price is that the random nonce makes two
encodings of one payload differ, so a retried workflow task may store a second
copy of an offloaded payload (harmless: each claim names its own file).

Files at rest (`seal` / `unseal`): MAGIC, the key id, a newline, nonce +
ciphertext. A file without MAGIC is plaintext written before encryption was on
and is read as it is; its content address (the digest of the plaintext) tells
whether either kind of file is intact.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import History
from temporalio.converter import DataConverter, EncodingPayloadConverter, PayloadCodec

KEYS_ENV = "PERDURE_PAYLOAD_KEYS"
KEY_FILE_ENV = "PERDURE_PAYLOAD_KEY_FILE"

ENCODING = b"binary/encrypted"
KEY_ID_METADATA = "encryption-key-id"
MAGIC = b"\x00perdure-sealed-v1\n"

# Bound into every ciphertext as associated data, with the key id: a payload's
# ciphertext cannot be passed off as an artifact's, nor either under another key id.
PAYLOAD_PURPOSE = b"perdure/payload/v1"
FILE_PURPOSE = b"perdure/file/v1"

KEY_BYTES = 32
NONCE_BYTES = 12
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class PayloadKeyError(ValueError):
    """PERDURE_PAYLOAD_KEYS or PERDURE_PAYLOAD_KEY_FILE cannot be used as it is."""


class DecryptionError(ValueError):
    """Encrypted data that these keys cannot decrypt (ValueError: the CLI prints it without a traceback)."""


class UnknownPayloadKey(DecryptionError):
    """Data encrypted with a key id that is not configured here."""


@dataclass(frozen=True)
class PayloadKey:
    key_id: str
    secret: bytes = field(repr=False)


class Keyring:
    """The configured keys, oldest first: the last one encrypts, any one decrypts what names it."""

    def __init__(self, keys: Sequence[PayloadKey]) -> None:
        if not keys:
            raise PayloadKeyError("a keyring needs at least one key")
        ids = [k.key_id for k in keys]
        if duplicates := sorted({i for i in ids if ids.count(i) > 1}):
            raise PayloadKeyError(f"key ids must be unique; repeated: {', '.join(duplicates)}")
        for key in keys:
            if not _KEY_ID.fullmatch(key.key_id):
                raise PayloadKeyError(f"key id {key.key_id!r}: use 1 to 64 of A-Z a-z 0-9 . _ -")
            if len(key.secret) != KEY_BYTES:
                raise PayloadKeyError(
                    f"key {key.key_id!r} is {len(key.secret)} bytes; AES-256 needs {KEY_BYTES} "
                    "(make one with `openssl rand -base64 32`)"
                )
        # Imported here, not at the top: a test module that defines a workflow and imports
        # this one (through the converter) is re-imported in the workflow sandbox, which
        # cannot load cryptography's native extension a second time.
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self.keys = tuple(keys)
        self._ciphers = {k.key_id: AESGCM(k.secret) for k in keys}

    @property
    def newest(self) -> str:
        return self.keys[-1].key_id

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(k.key_id for k in self.keys)

    def __repr__(self) -> str:
        return f"Keyring({', '.join(self.key_ids)})"

    def encrypt(self, plaintext: bytes, purpose: bytes) -> tuple[str, bytes]:
        """(key id, nonce + ciphertext) under the newest key."""
        key_id = self.newest
        nonce = os.urandom(NONCE_BYTES)
        return key_id, nonce + self._ciphers[key_id].encrypt(nonce, plaintext, _associated(purpose, key_id))

    def decrypt(self, key_id: str, sealed: bytes, purpose: bytes, what: str) -> bytes:
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise UnknownPayloadKey(
                f"{what} is encrypted with key {key_id!r}, which is not configured here "
                f"(configured: {', '.join(self.key_ids)}); add it to {KEYS_ENV} or {KEY_FILE_ENV}"
            )
        from cryptography.exceptions import InvalidTag

        try:
            return cipher.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], _associated(purpose, key_id))
        except InvalidTag:
            raise DecryptionError(
                f"{what} does not decrypt with key {key_id!r}: it was altered, or the key under that id changed"
            ) from None


def _associated(purpose: bytes, key_id: str) -> bytes:
    return purpose + b"\x00" + key_id.encode()


# ------------------------------------------------------------------ configuration


def keyring_from_env() -> Keyring | None:
    """The keys the environment names, or None (encryption off). Reads the key file, if named."""
    inline = os.environ.get(KEYS_ENV, "").strip()
    if inline:
        return Keyring(parse_keys(inline.replace(",", "\n"), KEYS_ENV))
    path = os.environ.get(KEY_FILE_ENV, "").strip()
    if not path:
        return None
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as err:
        raise PayloadKeyError(f"{KEY_FILE_ENV}={path}: cannot read it ({err.strerror})") from None
    return Keyring(parse_keys(text, f"{KEY_FILE_ENV}={path}"))


def parse_keys(text: str, source: str) -> list[PayloadKey]:
    """`id:base64` entries, one per line, oldest first. Error messages name `source`, never a key."""
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        key_id, colon, encoded = (part.strip() for part in entry.partition(":"))
        if not colon or not key_id or not encoded:
            raise PayloadKeyError(f"{source}: entry {number} is not id:base64key")
        try:
            secret = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise PayloadKeyError(f"{source}: key {key_id!r} is not valid base64") from None
        keys.append(PayloadKey(key_id, secret))
    if not keys:
        raise PayloadKeyError(f"{source}: no keys in it")
    try:
        Keyring(keys)
    except PayloadKeyError as err:
        raise PayloadKeyError(f"{source}: {err}") from None
    return keys


def new_key_entry(key_id: str) -> str:
    """A fresh `id:base64` entry for PERDURE_PAYLOAD_KEYS or the key file."""
    entry = f"{key_id}:{base64.b64encode(os.urandom(KEY_BYTES)).decode()}"
    parse_keys(entry, "the new key")
    return entry


# ------------------------------------------------------------------ history


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM over whole payloads; payloads not encrypted pass through on decode."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        key_id, sealed = self.keyring.encrypt(payload.SerializeToString(), PAYLOAD_PURPOSE)
        return Payload(metadata={"encoding": ENCODING, KEY_ID_METADATA: key_id.encode()}, data=sealed)

    def decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        key_id = payload.metadata.get(KEY_ID_METADATA, b"").decode(errors="replace")
        if not key_id:
            raise DecryptionError(f"an encrypted payload has no {KEY_ID_METADATA} in its metadata")
        decrypted = Payload()
        decrypted.ParseFromString(self.keyring.decrypt(key_id, payload.data, PAYLOAD_PURPOSE, "a payload"))
        return decrypted


def is_encrypted(payload: Payload) -> bool:
    return payload.metadata.get("encoding") == ENCODING


def key_id_of(payload: Payload) -> str:
    """The id of the key an encrypted payload names (empty when it names none)."""
    return payload.metadata.get(KEY_ID_METADATA, b"").decode(errors="replace")


class CiphertextPayloadConverter(EncodingPayloadConverter):
    """Reads a payload that is still ciphertext when it reaches the payload converter, which
    happens only where no keys are configured (with keys the codec decrypts first): it says
    which key the payload needs instead of "unknown encoding". It encodes nothing."""

    @property
    def encoding(self) -> str:
        return ENCODING.decode()

    def to_payload(self, value: Any) -> Payload | None:
        return None

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        raise UnknownPayloadKey(
            f"a payload is encrypted ({ENCODING.decode()}) with key {key_id_of(payload)!r}, but no payload keys "
            f"are configured here; set {KEYS_ENV} or {KEY_FILE_ENV}"
        )


def keyring_of(converter: DataConverter) -> Keyring | None:
    """The keys a data converter encrypts and decrypts payloads with; None when it does not."""
    codec = converter.payload_codec
    return codec.keyring if isinstance(codec, EncryptionCodec) else None


# ------------------------------------------------------------------ files at rest


def seal(keyring: Keyring, data: bytes) -> bytes:
    key_id, sealed = keyring.encrypt(data, FILE_PURPOSE)
    return MAGIC + key_id.encode() + b"\n" + sealed


def is_sealed(raw: bytes) -> bool:
    return raw.startswith(MAGIC)


def unseal(keyring: Keyring | None, raw: bytes, what: str) -> bytes:
    """The plaintext of a file `seal` wrote; `what` names the file in errors."""
    key_id, newline, sealed = raw[len(MAGIC) :].partition(b"\n")
    if not newline:
        raise DecryptionError(f"{what} is cut short: no key id after the encryption header")
    name = key_id.decode(errors="replace")
    if keyring is None:
        raise UnknownPayloadKey(
            f"{what} is encrypted with key {name!r}, but no keys are configured; set {KEYS_ENV} or {KEY_FILE_ENV}"
        )
    return keyring.decrypt(name, sealed, FILE_PURPOSE, what)


# ------------------------------------------------------------------ whole histories


async def decode_history(history: History, codec: PayloadCodec) -> History:
    """A copy of `history` with every payload run through `codec.decode`, and each failure
    whose message travelled encrypted given back its message and stack trace: the history
    as it would read had it been written without the codec (references to offloaded
    payloads stay references). Payloads the codec does not know pass through."""
    decoded = History()
    decoded.CopyFrom(history)
    payloads = list(_payloads_in(decoded))
    for payload, plain in zip(payloads, await codec.decode(payloads), strict=True):
        if plain is not payload:
            payload.CopyFrom(plain)
    for failure in _failures_in(decoded):
        _restore_failure_attributes(failure)
    return decoded


def _messages_in(message: Message) -> Iterator[Message]:
    """`message` and every message inside it, depth first."""
    yield message
    for descriptor, value in message.ListFields():
        if descriptor.type != descriptor.TYPE_MESSAGE:
            continue
        if hasattr(value, "ListFields"):
            items = (value,)
        elif descriptor.message_type.GetOptions().map_entry:
            items = value.values() if descriptor.message_type.fields_by_name["value"].message_type else ()
        else:
            items = value
        for item in items:
            yield from _messages_in(item)


def _payloads_in(message: Message) -> Iterator[Payload]:
    # Payloads holds Payload messages, so every payload, wrapped or not, is reached once.
    return (m for m in _messages_in(message) if isinstance(m, Payload))


def _failures_in(message: Message) -> Iterator[Failure]:
    return (m for m in _messages_in(message) if isinstance(m, Failure))


def _restore_failure_attributes(failure: Failure) -> None:
    attributes = failure.encoded_attributes
    if not failure.HasField("encoded_attributes") or attributes.metadata.get("encoding") != b"json/plain":
        return
    try:
        fields = json.loads(attributes.data)
    except ValueError:
        return
    if isinstance(fields, dict):
        failure.message = str(fields.get("message", failure.message))
        failure.stack_trace = str(fields.get("stack_trace", failure.stack_trace))
        failure.ClearField("encoded_attributes")
