"""Receipt handles: opaque, new on every receive, authenticated with the shard secret.

A handle names (shard, queue incarnation, message sequence, epoch) plus a hash of the queue
name, so a handle used on another queue is recognised as invalid rather than routed. The
epoch is the message's receive count at the receive that issued the handle: fencing is a
comparison of that epoch with the message's current one. The nonce comes from the leader's
random source inside the command, so every replica builds the same handle.
"""

from __future__ import annotations

import binascii
import functools
import hashlib
import hmac
import struct
from dataclasses import dataclass

_VERSION = 1
_BODY = struct.Struct(">BHQQIIQ")  # version, shard, queue id, seq, epoch, name hash, nonce
_MAC_LEN = 16


@dataclass(frozen=True)
class ReceiptHandle:
    shard_id: int
    queue_id: int
    seq: int
    epoch: int
    name_hash: int
    nonce: int


@functools.lru_cache(maxsize=4096)  # every receive and delete asks, for a few queue names
def queue_name_hash(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


_BLOCK = 64  # SHA-256's block size: HMAC pads (or first hashes) the key to it
# base64's alphabet to the URL-safe one and back, as base64.urlsafe_b64encode/-decode do.
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


@functools.lru_cache(maxsize=16)
def _keyed(secret: bytes) -> tuple[hashlib._Hash, hashlib._Hash]:
    """HMAC-SHA256's inner and outer hash states after absorbing the padded key (RFC 2104).
    Copying these two costs less per handle than ``hmac``'s objects (every receive and
    delete signs or checks one), and gives the same digest."""
    key = hashlib.sha256(secret).digest() if len(secret) > _BLOCK else secret
    key = key.ljust(_BLOCK, b"\0")
    return (hashlib.sha256(bytes(b ^ 0x36 for b in key)),
            hashlib.sha256(bytes(b ^ 0x5C for b in key)))


def _mac(secret: bytes, body: bytes) -> bytes:
    inner, outer = _keyed(secret)
    i = inner.copy()
    i.update(body)
    o = outer.copy()
    o.update(i.digest())
    return o.digest()[:_MAC_LEN]


def encode_receipt(secret: bytes, shard_id: int, queue_id: int, seq: int, epoch: int,
                   name_hash: int, nonce: int) -> str:
    """``encode_receipt_handle`` without building the ReceiptHandle first."""
    body = _BODY.pack(_VERSION, shard_id, queue_id, seq, epoch, name_hash, nonce)
    raw = binascii.b2a_base64(body + _mac(secret, body), newline=False)
    return raw.translate(_TO_URLSAFE).decode().rstrip("=")


def encode_receipt_handle(secret: bytes, handle: ReceiptHandle) -> str:
    return encode_receipt(secret, handle.shard_id, handle.queue_id, handle.seq, handle.epoch,
                          handle.name_hash, handle.nonce)


def _raw(text: str) -> bytes | None:
    if not text or len(text) > 256:
        return None
    try:  # base64.urlsafe_b64decode, as lenient: characters outside the alphabet are skipped
        raw = binascii.a2b_base64(
            (text + "=" * (-len(text) % 4)).encode("ascii").translate(_FROM_URLSAFE))
    except (binascii.Error, ValueError):  # UnicodeEncodeError is a ValueError
        return None
    return raw if len(raw) == _BODY.size + _MAC_LEN else None


def shard_of_receipt_handle(text: str) -> int | None:
    """The shard a handle names, read without the secret: where a gateway sends it. Only a
    routing hint; the shard itself authenticates the handle."""
    raw = _raw(text)
    return None if raw is None or raw[0] != _VERSION else _BODY.unpack(raw[: _BODY.size])[1]


def decode_receipt(secret: bytes, text: str) -> tuple[int, int, int, int, int, int] | None:
    """(shard, queue id, seq, epoch, name hash, nonce) of a handle, or None when it is
    garbled, forged or altered: ``decode_receipt_handle`` without the ReceiptHandle."""
    raw = _raw(text)
    if raw is None:
        return None
    body, mac = raw[: _BODY.size], raw[_BODY.size :]
    if not hmac.compare_digest(mac, _mac(secret, body)):
        return None
    fields = _BODY.unpack(body)
    return fields[1:] if fields[0] == _VERSION else None


def decode_receipt_handle(secret: bytes, text: str) -> ReceiptHandle | None:
    """The handle, or None when it is garbled, forged or altered."""
    fields = decode_receipt(secret, text)
    return None if fields is None else ReceiptHandle(*fields)
