"""Receipt handles: opaque, new on every receive, authenticated with the shard secret.

A handle names (shard, queue incarnation, message sequence, epoch) plus a hash of the queue
name, so a handle used on another queue is recognised as invalid rather than routed. The
epoch is the message's receive count at the receive that issued the handle: fencing is a
comparison of that epoch with the message's current one. The nonce comes from the leader's
random source inside the command, so every replica builds the same handle.
"""

from __future__ import annotations

import base64
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


@functools.lru_cache(maxsize=16)
def _keyed(secret: bytes) -> hmac.HMAC:
    """The HMAC state after absorbing the key; a copy of it costs less than keying anew."""
    return hmac.new(secret, digestmod=hashlib.sha256)


def _mac(secret: bytes, body: bytes) -> bytes:
    h = _keyed(secret).copy()
    h.update(body)
    return h.digest()[:_MAC_LEN]


def encode_receipt_handle(secret: bytes, handle: ReceiptHandle) -> str:
    body = _BODY.pack(
        _VERSION,
        handle.shard_id,
        handle.queue_id,
        handle.seq,
        handle.epoch,
        handle.name_hash,
        handle.nonce,
    )
    mac = _mac(secret, body)
    return base64.urlsafe_b64encode(body + mac).decode().rstrip("=")


def _raw(text: str) -> bytes | None:
    if not text or len(text) > 256:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == _BODY.size + _MAC_LEN else None


def shard_of_receipt_handle(text: str) -> int | None:
    """The shard a handle names, read without the secret: where a gateway sends it. Only a
    routing hint; the shard itself authenticates the handle."""
    raw = _raw(text)
    return None if raw is None or raw[0] != _VERSION else _BODY.unpack(raw[: _BODY.size])[1]


def decode_receipt_handle(secret: bytes, text: str) -> ReceiptHandle | None:
    """The handle, or None when it is garbled, forged or altered."""
    raw = _raw(text)
    if raw is None:
        return None
    body, mac = raw[: _BODY.size], raw[_BODY.size :]
    if not hmac.compare_digest(mac, _mac(secret, body)):
        return None
    version, shard_id, queue_id, seq, epoch, name_hash, nonce = _BODY.unpack(body)
    if version != _VERSION:
        return None
    return ReceiptHandle(shard_id, queue_id, seq, epoch, name_hash, nonce)
