"""The pieces ``sqsq.shard.peers`` is made of: one authenticated connection (``Link``) and
what the transport keeps per peer (``PeerState``)."""

from __future__ import annotations

import asyncio
import struct
from collections import deque

from sqsq.raft.types import Message
from sqsq.shard.peerauth import FrameTooLarge
from sqsq.shard.snapxfer import Receiving

# A frame: [u32 length of what follows][u8 kind][payload].
KIND_MESSAGES = 1  # raftwire.encode_messages
KIND_CHUNK = 2  # raftwire.encode_chunk
KIND_ACK = 3  # receiver -> sender: raftwire.encode_ack(transfer, whole)
KIND_ABORT = 4  # sender -> receiver: the sender gave the transfer up; same payload
KIND_WRITE_SETS = 5  # raftwire.encode_write_sets
_HEADER = struct.Struct(">IB")


def frame(kind: int, payload: bytes) -> bytes:
    return _HEADER.pack(len(payload) + 1, kind) + payload


def message_size(m: Message) -> int:
    """An upper bound on ``m``'s encoded size, for the queue's byte bound (encoding each
    message as it is queued would cost what the batch encoding saves)."""
    size = 96 + 4 * (len(m.to) + len(m.frm)) + len(m.context)
    for e in m.entries:
        size += 48 + len(e.data)
    if m.snapshot is not None:
        conf = m.snapshot.conf
        size += 32 + sum(8 + 4 * len(v) for v in conf.voters | conf.learners)
    return size


class Link:
    """One authenticated connection with a peer, either way dialed. ``closed``: nothing
    more is written on it (lost, dropped, or retired as the redundant one of two)."""

    def __init__(self, peer_id: str, incarnation: bytes, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, *, dialed: bool, receiving: Receiving) -> None:
        self.peer_id, self.incarnation, self.dialed = peer_id, incarnation, dialed
        self._reader, self._writer = reader, writer
        self.closed = False
        self.task: asyncio.Task | None = None
        self.outgoing: dict[int, asyncio.Future[bool]] = {}  # transfers awaiting their ack
        self.receiving = receiving

    def write(self, kind: int, payload: bytes, ahead: bytes = b"") -> int:
        """Queue a frame on the socket, after ``ahead`` (frames already made, so that both
        go in one system call); never waits. The size on the wire."""
        self._writer.write(ahead + _HEADER.pack(len(payload) + 1, kind) + payload)
        return len(ahead) + _HEADER.size + len(payload)

    def write_bytes(self, frames: bytes) -> int:
        """Queue frames already made (``frame``) on the socket; their size."""
        self._writer.write(frames)
        return len(frames)

    async def read(self, max_bytes: int) -> tuple[int, bytes]:
        """The next frame's kind and payload; ``FrameTooLarge`` on a length prefix over
        ``max_bytes``, before reading any of it."""
        size, kind = _HEADER.unpack(await self._reader.readexactly(_HEADER.size))
        if size > max_bytes:
            raise FrameTooLarge(f"a frame of {size} bytes, more than {max_bytes}")
        if size == 0:
            raise ValueError("a frame without a kind")
        return kind, await self._reader.readexactly(size - 1)

    def buffered(self) -> int:
        return self._writer.transport.get_write_buffer_size()

    async def drain(self) -> None:
        await self._writer.drain()

    def retire(self) -> None:
        """Send nothing more, but read on until the peer, retiring it too, closes its end:
        what it sent before it knew is still delivered."""
        self.closed = True
        if self._writer.can_write_eof():
            self._writer.write_eof()

    def abort(self) -> None:
        self.closed = True
        self._writer.transport.abort()


class PeerState:
    """What the transport keeps for one peer: where it is, what waits to be sent, the
    connection in use (``links`` by "dialed by us"; two only while a duplicate is settled)."""

    def __init__(self, peer_id: str) -> None:
        self.id = peer_id
        self.address: tuple[str, int] | None = None
        self.queue: deque[tuple[int, Message, int]] = deque()  # (shard, message, size)
        self.queued_bytes = 0
        # write sets (shard, index, term, check, packed) to go ahead of the queue's messages
        self.write_sets: list[tuple[int, int, int, int, bytes | None]] = []
        self.write_set_bytes = 0
        self.write_sets_due = False  # a flush of them is set for when no message took them
        self.links: dict[bool, Link] = {}
        self.connected = asyncio.Event()
        self.dialer: asyncio.Task | None = None
        self.flush_scheduled = False
        self.ever_connected = False
        self.reachable = True  # so that losing it is logged once, not at every retry
        self.forgotten = False

    def active(self) -> Link | None:
        for link in self.links.values():
            if not link.closed:
                return link
        return None

    def clear_queue(self) -> None:
        self.queue.clear()
        self.queued_bytes = 0
