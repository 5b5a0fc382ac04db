"""A peer connection's protocol (``sqsq.shard.peerlink.Link``) fed by hand: what it reads
before the transport has taken the connection is bounded."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

from sqsq.raft.types import Message, MsgType
from sqsq.shard import snapxfer
from sqsq.shard.peerlink import KIND_MESSAGES, READ_BUFFER_BYTES, Link
from sqsq.shard.raftwire import decode_messages, encode_messages


class FakeSocket(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def abort(self) -> None:
        pass


def feed(link: Link, socket: FakeSocket, data: bytes) -> bytes:
    """As the event loop does: read into the buffer the protocol offers, a piece at a time,
    while reading is on; what was left unread."""
    while data and socket.reading:
        buf = link.get_buffer(-1)
        n = min(len(buf), len(data))
        buf[:n] = data[:n]
        link.buffer_updated(n)
        data = data[n:]
    return data


def test_what_a_peer_sends_before_it_is_taken_on_is_read_no_further_than_a_buffer(
        tmp_path: Path) -> None:
    link = Link(dialed=False, max_frame_bytes=1 << 26,
                receiving=snapxfer.Receiving(tmp_path, 1, 1 << 20))
    socket = FakeSocket()
    link.connection_made(socket)
    hello = b"the client's hello"
    message = Message(MsgType.APPEND, "a", "z", 1, context=b"x" * 1000)
    batch = encode_messages([(0, message)])
    frames = (struct.pack(">IB", len(batch) + 1, KIND_MESSAGES) + batch) * 400  # 400 KB
    unread = feed(link, socket, struct.pack(">I", len(hello)) + hello + frames)
    # The handshake frame is cut out; what follows waits, and reading stopped once a
    # buffer's worth waited (an unproven peer cannot make the node hold more).
    assert link._handshake.popleft() == hello  # noqa: SLF001
    assert not socket.reading
    assert len(frames) - 2 * READ_BUFFER_BYTES < len(unread) < len(frames)
    got: list[Message] = []
    link.start("z", b"12345678", lambda kind, payload: got.extend(
        m for _, m in decode_messages(payload)), lambda e: None, lambda: None)
    assert socket.reading  # taken on: reading again, and what waited is handed on
    assert feed(link, socket, unread) == b""
    assert got == [message] * 400
