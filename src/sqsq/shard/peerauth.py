"""The start of every Raft peer connection: each side proves it holds the cluster secret.

A challenge both ways, so neither side takes the other's word for who it is:

1. the server (the side that accepted) sends a fresh random nonce;
2. the client answers with its node id, its incarnation, a nonce of its own and
   HMAC-SHA256(secret, b"sqsq-raft client" + server nonce + client id);
3. the server checks that (in constant time) and only then answers with its id, its
   incarnation and HMAC-SHA256(secret, b"sqsq-raft server" + client nonce + server id),
   which the client checks, along with the id being the one it meant to reach.

The roles are in the MAC so that one side's answer can never be replayed as the other's; the
nonces are fresh per connection so that no answer can be replayed on another connection. This
proves knowledge of the secret, not the channel's integrity: a node-to-node network that an
attacker can sit in the middle of needs TLS as well.

Until both steps passed, only these small frames are read (``HANDSHAKE_MAX_BYTES``), so a
peer that does not know the secret can neither send a message that gets decoded nor make the
node allocate a large frame.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from hashlib import sha256

import msgpack

from sqsq.shard.raftwire import FORMAT_VERSION, MAX_ID_CHARS

NONCE_BYTES = 32
INCARNATION_BYTES = 8
HANDSHAKE_MAX_BYTES = 4096
HANDSHAKE_TIMEOUT_S = 5.0  # a connection that does not finish it holds a descriptor
_LENGTH = struct.Struct(">I")

# The handshake over any connection: ``Receive`` gives the next handshake frame's payload
# (``FrameTooLarge`` past ``HANDSHAKE_MAX_BYTES``), ``Send`` writes bytes. The transport's
# connections cut the frames in their protocol (``sqsq.shard.peerlink.Link``); a plain
# stream pair works too (``accept``, ``dial``).
Receive = Callable[[], Awaitable[bytes]]
Send = Callable[[bytes], None]


class AuthError(Exception):
    """The other side did not prove it holds the secret, or is not who we dialed."""


class FrameTooLarge(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Hello:
    """Who is at the other end, proven: its node id, and which start of that node (a new
    incarnation means the old connections to it are dead, whatever TCP says)."""

    peer_id: str
    incarnation: bytes


def frame_header(size: int) -> bytes:
    return _LENGTH.pack(size)


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    """One ``[u32 length][payload]`` frame; ``FrameTooLarge`` before reading a payload longer
    than ``max_bytes`` (the length prefix is the only thing trusted before the payload)."""
    (size,) = _LENGTH.unpack(await reader.readexactly(4))
    if size > max_bytes:
        raise FrameTooLarge(f"a frame of {size} bytes, more than {max_bytes}")
    return await reader.readexactly(size)


def _mac(secret: bytes, role: bytes, nonce: bytes, node_id: str) -> bytes:
    # The nonce has a fixed length, so nonce + id cannot be read two ways.
    return hmac.new(secret, b"sqsq-raft " + role + nonce + node_id.encode(), sha256).digest()


def _send(send: Send, value: list[object]) -> None:
    payload = msgpack.packb(value, use_bin_type=True)
    send(frame_header(len(payload)) + payload)


async def _receive(receive: Receive, length: int) -> list[object]:
    raw = await receive()
    try:
        value = msgpack.unpackb(raw, raw=False, use_list=True)
    except Exception:  # noqa: BLE001 - untrusted bytes: anything the parser trips on
        raise AuthError("the handshake is not msgpack") from None
    if not isinstance(value, list) or len(value) != length or value[0] != FORMAT_VERSION:
        raise AuthError("the handshake has the wrong shape or format version")
    return value


def _check_id(value: object) -> str:
    if type(value) is not str or not 0 < len(value) <= MAX_ID_CHARS:
        raise AuthError("the handshake names no node id")
    return value


def _check_bytes(value: object, size: int, what: str) -> bytes:
    if type(value) is not bytes or len(value) != size:
        raise AuthError(f"the handshake's {what} is not {size} bytes")
    return value


def _stream(reader: asyncio.StreamReader) -> Receive:
    return lambda: read_frame(reader, HANDSHAKE_MAX_BYTES)


async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 secret: bytes, node_id: str, incarnation: bytes) -> Hello:
    """``accept_frames`` over a stream pair."""
    return await accept_frames(_stream(reader), writer.write, secret=secret, node_id=node_id,
                               incarnation=incarnation)


async def dial(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
               secret: bytes, node_id: str, incarnation: bytes, expect: str) -> Hello:
    """``dial_frames`` over a stream pair."""
    return await dial_frames(_stream(reader), writer.write, secret=secret, node_id=node_id,
                             incarnation=incarnation, expect=expect)


async def accept_frames(receive: Receive, send: Send, *, secret: bytes, node_id: str,
                        incarnation: bytes) -> Hello:
    """The server's side: who dialed us, proven; ``AuthError`` if they could not prove it."""
    nonce = os.urandom(NONCE_BYTES)
    _send(send, [FORMAT_VERSION, nonce])
    _, client_id, their_incarnation, their_nonce, mac = await _receive(receive, 5)
    client_id = _check_id(client_id)
    their_incarnation = _check_bytes(their_incarnation, INCARNATION_BYTES, "incarnation")
    their_nonce = _check_bytes(their_nonce, NONCE_BYTES, "nonce")
    if type(mac) is not bytes or not hmac.compare_digest(
            mac, _mac(secret, b"client", nonce, client_id)):
        raise AuthError(f"{client_id!r:.80} does not know the cluster secret")
    if client_id == node_id:
        raise AuthError("a connection from a node with this node's own id")
    _send(send, [FORMAT_VERSION, node_id, incarnation,
                 _mac(secret, b"server", their_nonce, node_id)])
    return Hello(client_id, their_incarnation)


async def dial_frames(receive: Receive, send: Send, *, secret: bytes, node_id: str,
                      incarnation: bytes, expect: str) -> Hello:
    """The client's side: the server we reached is ``expect`` and holds the secret."""
    _, server_nonce = await _receive(receive, 2)
    server_nonce = _check_bytes(server_nonce, NONCE_BYTES, "nonce")
    nonce = os.urandom(NONCE_BYTES)
    _send(send, [FORMAT_VERSION, node_id, incarnation, nonce,
                 _mac(secret, b"client", server_nonce, node_id)])
    _, server_id, their_incarnation, mac = await _receive(receive, 4)
    server_id = _check_id(server_id)
    their_incarnation = _check_bytes(their_incarnation, INCARNATION_BYTES, "incarnation")
    if type(mac) is not bytes or not hmac.compare_digest(
            mac, _mac(secret, b"server", nonce, server_id)):
        raise AuthError(f"{server_id!r:.80} does not know the cluster secret")
    if server_id != expect:
        # An address that now belongs to another node (a replaced machine): do not hand
        # it messages meant for the one we asked for.
        raise AuthError(f"dialed {expect!r:.80} but {server_id!r:.80} answered")
    return Hello(server_id, their_incarnation)
