"""The pieces ``sqsq.shard.peers`` is made of: one authenticated connection (``Link``, the
socket's protocol) and what the transport keeps per peer (``PeerState``)."""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable
from typing import Any

from sqsq.raft.types import Message
from sqsq.shard.peerauth import HANDSHAKE_MAX_BYTES, FrameTooLarge
from sqsq.shard.snapxfer import Receiving

# A frame: [u32 length of what follows][u8 kind][payload].
KIND_MESSAGES = 1  # raftwire.encode_messages
KIND_CHUNK = 2  # raftwire.encode_chunk
KIND_ACK = 3  # receiver -> sender: raftwire.encode_ack(transfer, whole)
KIND_ABORT = 4  # sender -> receiver: the sender gave the transfer up; same payload
KIND_WRITE_SETS = 5  # raftwire.encode_write_sets
_HEADER = struct.Struct(">IB")
_LENGTH = struct.Struct(">I")


def frame_header(kind: int, size: int) -> bytes:
    """The header of a frame of ``kind`` whose payload is ``size`` bytes."""
    return _HEADER.pack(size + 1, kind)


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


# The read buffer: what one read may fill (asyncio's own reads take up to 256 KB), the least
# room offered to a read, and the size past which a buffer grown for a large frame is let go
# once empty (below it, it is kept: the next large frame needs no new one).
READ_BUFFER_BYTES = 256 << 10
MIN_READ_BYTES = 64 << 10
KEEP_BUFFER_BYTES = 4 << 20

# (kind, payload): the payload is a view of the read buffer, valid only during the call.
FrameHandler = Callable[[int, memoryview], None]


class Link(asyncio.BufferedProtocol):
    """One connection with a peer, either way dialed, as the protocol of its socket.

    The socket reads straight into the link's buffer (a ``BufferedProtocol``: no bytes
    object per read). First the handshake (``sqsq.shard.peerauth``): its ``[u32 length]
    [payload]`` frames, at most ``HANDSHAKE_MAX_BYTES`` each and only as many as that side's
    part of the handshake reads, are cut out and handed to ``handshake_frame``; anything
    after them waits until the transport, the peer proven, calls ``start``. From then on
    each read's whole frames are handed to ``on_frame`` in the read's own callback, as views
    of the buffer (decoding copies what it keeps): no reader task to wake, no extra loop
    turn per frame on each hop (a stream reader's ``readexactly`` cost both, 40-70 us a
    loopback hop), no copy of a payload. A frame larger than the buffer gets a buffer of
    its size once its length prefix is in (never more than ``max_frame_bytes``).

    ``closed``: nothing more is written on it (lost, dropped, or retired as the redundant
    one of two); ``gone``: nothing more is read either (lost or aborted)."""

    def __init__(self, *, dialed: bool, max_frame_bytes: int, receiving: Receiving,
                 on_made: Callable[[Link], None] | None = None) -> None:
        self.dialed = dialed
        self.max_frame_bytes = max_frame_bytes
        self.peer_id, self.incarnation = "", b""
        self.closed = self.gone = False
        self.outgoing: dict[int, asyncio.Future[bool]] = {}  # transfers awaiting their ack
        self.receiving = receiving
        self._transport: asyncio.Transport | None = None
        self._on_made = on_made
        # what arrived: frames not yet handed on are self._buffer[self._start:self._end]
        self._buffer = bytearray(READ_BUFFER_BYTES)
        self._start = self._end = 0
        self._need = 0  # the size of the frame begun at _start, once its header is in
        self._reading_paused = False
        # the handshake: frames still to cut (the dialer reads two, the acceptor one)
        self._handshake_left = 2 if dialed else 1
        self._handshake: deque[bytes] = deque()
        self._handshake_waiter: asyncio.Future[None] | None = None
        self._error: Exception | None = None  # why no more handshake frames will come
        self._on_frame: FrameHandler | None = None
        self._on_error: Callable[[Exception], None] | None = None
        self._on_lost: Callable[[], None] | None = None
        self._paused = False  # the socket's write buffer is over its high-water mark
        self._drained: asyncio.Future[None] | None = None

    # ---- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        # (uvloop's transports have asyncio.Transport's methods without subclassing it)
        self._transport = transport
        if self._on_made is not None:
            self._on_made(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        buf = self._buffer
        if self._need:
            if len(buf) - self._start < self._need:
                self._make_room(max(self._need, READ_BUFFER_BYTES))
        elif len(buf) - self._end < MIN_READ_BYTES:
            self._make_room(max(self._end - self._start + MIN_READ_BYTES, READ_BUFFER_BYTES))
        return memoryview(self._buffer)[self._end:]

    def _make_room(self, size: int) -> None:
        """Move what is pending to the buffer's start, in a larger buffer if it needs
        ``size``. (A buffer is never resized in place: a view of it may still be alive.)"""
        buf, start, end = self._buffer, self._start, self._end
        pending = end - start
        if len(buf) >= size:
            buf[:pending] = buf[start:end]
        else:
            self._buffer = bytearray(size)
            self._buffer[:pending] = buf[start:end]
        self._start, self._end = 0, pending

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        if self._on_frame is not None:
            self._cut()
            return
        if self._handshake_left and self._error is None:
            self._cut_handshake()
        if (not self._handshake_left or self._error is not None) and \
                self._end - self._start >= READ_BUFFER_BYTES and not self._reading_paused:
            # Past the handshake but not yet started (or failed): read no more than a
            # buffer's worth until the transport takes the connection (or aborts it).
            assert self._transport is not None
            self._transport.pause_reading()
            self._reading_paused = True

    def eof_received(self) -> bool:
        # The peer closed its end (after retiring this connection too, or stopping): the
        # connection is done with; aborting it here need not wait for our writes to drain.
        self._lost(ConnectionResetError("the peer closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc or ConnectionResetError("the connection was lost"))

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drainer(None)

    # ---- the handshake -------------------------------------------------------------------

    async def handshake_frame(self) -> bytes:
        """The next handshake frame's payload (``peerauth.Receive``)."""
        while not self._handshake:
            if self._error is not None:
                raise self._error
            self._handshake_waiter = asyncio.get_running_loop().create_future()
            try:
                await self._handshake_waiter
            finally:
                self._handshake_waiter = None
        return self._handshake.popleft()

    def address(self) -> object:
        """The other end's address, for a log line."""
        return None if self._transport is None else self._transport.get_extra_info("peername")

    def send_raw(self, data: bytes) -> None:
        """Write handshake bytes (``peerauth.Send``)."""
        assert self._transport is not None
        self._transport.write(data)

    def _cut_handshake(self) -> None:
        buf = self._buffer
        while self._handshake_left and self._end - self._start >= 4:
            (size,) = _LENGTH.unpack_from(buf, self._start)
            if size > HANDSHAKE_MAX_BYTES:
                self._error = FrameTooLarge(f"a handshake frame of {size} bytes, more than "
                                            f"{HANDSHAKE_MAX_BYTES}")
                break
            begin = self._start + 4
            if self._end < begin + size:
                break
            self._handshake.append(bytes(buf[begin:begin + size]))
            self._start = begin + size
            self._handshake_left -= 1
        waiter = self._handshake_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ---- frames --------------------------------------------------------------------------

    def start(self, peer_id: str, incarnation: bytes, on_frame: FrameHandler,
              on_error: Callable[[Exception], None], on_lost: Callable[[], None]) -> None:
        """The peer is proven: from now on every whole frame goes to ``on_frame(kind,
        payload)`` as it arrives, a malformed header to ``on_error`` (the frame is not read),
        the connection's loss (once) to ``on_lost``. Frames that arrived during the
        handshake are handed on now."""
        self.peer_id, self.incarnation = peer_id, incarnation
        self._on_frame, self._on_error, self._on_lost = on_frame, on_error, on_lost
        if self.gone:
            on_lost()
            return
        if self._reading_paused:
            self._reading_paused = False
            assert self._transport is not None
            self._transport.resume_reading()
        if self._end > self._start:
            self._cut()

    def _cut(self) -> None:
        buf, start, end = self._buffer, self._start, self._end
        view = memoryview(buf)
        on_frame = self._on_frame
        assert on_frame is not None
        while end - start >= 5:
            size, kind = _HEADER.unpack_from(buf, start)
            if size > self.max_frame_bytes or size == 0:
                # The length prefix is all that is trusted before the payload: a larger
                # one closes the connection before any of it is read.
                self._fail(FrameTooLarge(f"a frame of {size} bytes, more than "
                                         f"{self.max_frame_bytes}") if size
                           else ValueError("a frame without a kind"))
                return
            stop = start + 4 + size
            if stop > end:
                self._need = 4 + size
                break
            self._start = start = stop
            on_frame(kind, view[stop - size + 1:stop])
            if self.gone:
                return  # dropped by what the frame said (or by the host)
        else:
            self._need = 0
        if start == end:
            self._start = self._end = 0
            if len(buf) > KEEP_BUFFER_BYTES:
                self._buffer = bytearray(READ_BUFFER_BYTES)

    def _fail(self, error: Exception) -> None:
        if self._on_error is not None:
            self._on_error(error)

    def _lost(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        waiter = self._handshake_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._wake_drainer(error)
        self.closed = True
        if not self.gone:
            self.gone = True
            if self._on_lost is not None:
                self._on_lost()

    # ---- writing -------------------------------------------------------------------------

    def write(self, kind: int, payload: bytes, ahead: list[bytes] | None = None) -> int:
        """Queue a frame on the socket, after the parts of frames already made (``ahead``,
        which this extends), so that all go in one system call; never waits. The size on
        the wire."""
        assert self._transport is not None
        header = _HEADER.pack(len(payload) + 1, kind)
        if ahead is None:
            data = header + payload
        else:
            # One join, one copy (``a + b + c`` copies a large payload twice).
            ahead += (header, payload)
            data = b"".join(ahead)
        self._transport.write(data)
        return len(data)

    def write_parts(self, parts: list[bytes]) -> int:
        """Queue frames already made, as their parts, on the socket; their size."""
        assert self._transport is not None
        data = b"".join(parts)
        self._transport.write(data)
        return len(data)

    def buffered(self) -> int:
        assert self._transport is not None
        return self._transport.get_write_buffer_size()

    async def drain(self) -> None:
        """Wait while the socket's write buffer is over its high-water mark;
        ``ConnectionResetError`` once the connection is lost."""
        if self.gone:
            raise ConnectionResetError("the connection was lost")
        if not self._paused:
            return
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._drained)

    def _wake_drainer(self, error: Exception | None) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            if error is None:
                drained.set_result(None)
            else:
                drained.set_exception(error)
                drained.exception()  # retrieved: nobody may be waiting any more

    def retire(self) -> None:
        """Send nothing more, but read on until the peer, retiring it too, closes its end:
        what it sent before it knew is still delivered."""
        self.closed = True
        if self._transport is not None and self._transport.can_write_eof():
            self._transport.write_eof()

    def abort(self) -> None:
        """Close the connection now, unsent bytes and all; ``on_lost`` is not called."""
        self.closed = self.gone = True
        if self._transport is not None:
            self._transport.abort()


class PeerState:
    """What the transport keeps for one peer: where it is, what waits to be sent, the
    connection in use (``links`` by "dialed by us"; two only while a duplicate is settled)."""

    def __init__(self, peer_id: str) -> None:
        self.id = peer_id
        self.address: tuple[str, int] | None = None
        self.queue: deque[tuple[int, Message]] = deque()  # (shard, message)
        self.queued_bytes = 0  # an upper bound on the queue's encoded size (message_size)
        # write sets (shard, index, term, check, packed) to go ahead of the queue's messages
        self.write_sets: list[tuple[int, int, int, int, bytes | None]] = []
        self.write_set_bytes = 0
        self.write_sets_due = False  # a flush of them is set for when no message took them
        self.write_sets_since = 0.0  # (loop time) when the oldest of them was queued
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
