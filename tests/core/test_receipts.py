"""Receipt handles are signed and encoded without the ``hmac`` and ``base64`` modules' Python
layers (every receive and delete makes or checks one): the strings must stay exactly what
those modules give, since handles issued before an upgrade are still held by clients, and
every replica must build the same ones."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct

import pytest

from sqsq.core.receipts import (
    ReceiptHandle,
    decode_receipt,
    decode_receipt_handle,
    encode_receipt,
    encode_receipt_handle,
    shard_of_receipt_handle,
)

_BODY = struct.Struct(">BHQQIIQ")


def reference_encode(secret: bytes, h: ReceiptHandle) -> str:
    """The encoding as it was written first, with the standard library's modules."""
    body = _BODY.pack(1, h.shard_id, h.queue_id, h.seq, h.epoch, h.name_hash, h.nonce)
    mac = hmac.new(secret, body, hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(body + mac).decode().rstrip("=")


def reference_decode(secret: bytes, text: str) -> ReceiptHandle | None:
    if not text or len(text) > 256:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    if len(raw) != _BODY.size + 16:
        return None
    body, mac = raw[: _BODY.size], raw[_BODY.size :]
    if not hmac.compare_digest(mac, hmac.new(secret, body, hashlib.sha256).digest()[:16]):
        return None
    version, *fields = _BODY.unpack(body)
    return ReceiptHandle(*fields) if version == 1 else None


SECRETS = [b"", b"k", b"test-secret", bytes(range(32)), b"\xff" * 64, b"s" * 65, b"long" * 50]
HANDLES = [
    ReceiptHandle(0, 1, 1, 1, 0, 0),
    ReceiptHandle(7, 2**64 - 1, 12345, 3, 2**32 - 1, 2**64 - 1),
    ReceiptHandle(65535, 99, 2**40, 2**32 - 1, 123456, 42),
]


@pytest.mark.parametrize("secret", SECRETS)
def test_handles_are_the_standard_hmac_and_url_safe_base64(secret: bytes) -> None:
    for h in HANDLES:
        text = reference_encode(secret, h)
        assert encode_receipt_handle(secret, h) == text
        assert encode_receipt(secret, h.shard_id, h.queue_id, h.seq, h.epoch, h.name_hash,
                              h.nonce) == text
        assert decode_receipt_handle(secret, text) == h
        assert decode_receipt(secret, text) == (h.shard_id, h.queue_id, h.seq, h.epoch,
                                                h.name_hash, h.nonce)
        assert shard_of_receipt_handle(text) == h.shard_id
        assert decode_receipt_handle(secret + b"x", text) is None


def test_garbled_handles_are_judged_as_before() -> None:
    """Whatever a client sends: the same handle or the same refusal as the reference."""
    secret = b"test-secret"
    good = reference_encode(secret, HANDLES[1])
    tampered = [
        "", "x", "=" * 4, good + "=", good + "==", good[:-1], good[1:], good + "A",
        good.replace(good[5], "A" if good[5] != "A" else "B", 1), good + " ", " " + good,
        good[:10] + "!" + good[10:], good[:10] + "\n" + good[10:], good[:10] + "é" + good[10:],
        good.replace("-", "+").replace("_", "/"), "A" * 300, good + "=" * 200,
    ]
    for text in tampered:
        assert decode_receipt_handle(secret, text) == reference_decode(secret, text), text
