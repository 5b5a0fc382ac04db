"""The frame connection: the multiplexed stream's messages over plain TCP.

gRPC's asyncio transport costs each read and each write a crossing from its poller thread
into the event loop, on both sides; at one call in flight that is about 0.4 ms of a 1.1 ms
send. On a frame connection a message is a 4-byte length and the protobuf message
(``sqsq.wire.framed``), read and written by the event loop itself. The gRPC stream stays the
API (and what other languages' clients use): its headers name this port and this server's
id, and the SDK moves its calls here when it can reach it (``sqsq.client._frames``).

What a gRPC stream checks, this checks the same way: the client's first message is a
``FrameHello`` (within ``HELLO_TIMEOUT_S``) with the stream's metadata, its token verified
for the Stream method; the server answers with an empty ``StreamReplyFrame`` (accepted) or
one whose ``refused`` says why not, and then closes the connection. The calls go through the
same ``StreamSession`` and so the same handlers; shutting down drains it like a stream. A
peer that sends what is not a frame is cut off.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import struct
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from sqsq.gateway.auth import Authenticator, AuthError
from sqsq.gateway.grpc_service import QueuesService
from sqsq.gateway.streaming import StreamSession, error_reply
from sqsq.listen import bind_listener
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import (
    FRAME_ID_KEY,
    FRAME_PORT_KEY,
    GRPC_METADATA_KEY,
    NOT_RUN,
    STREAM_METHOD,
    FrameError,
    FrameSplitter,
    framed,
)

log = logging.getLogger("sqsq.frames")

ENV_FRAME_PORT = "SQSQ_FRAME_PORT"

# Calls running on one connection before it stops reading (TCP then holds the client back,
# as HTTP/2 flow control does a gRPC stream).
MAX_CALLS_PER_CONNECTION = 4096
# What one read takes at most. A connection keeps its buffer while it lives (a server may
# hold many), so smaller than asyncio's own read size (256 KiB): a call is rarely larger,
# and a larger one takes a few reads, none of which allocates.
READ_BUFFER_BYTES = 64 << 10
_LENGTH = struct.Struct(">I")  # what ``sqsq.wire.framed`` puts before a message

# A connection must say hello within this long; one that does not would hold a descriptor
# (and a slot in the server's set) until the server stops.
HELLO_TIMEOUT_S = 10.0


def frame_port_setting() -> int | None:
    """Env ``SQSQ_FRAME_PORT``: the port (default 0: any free one; ``off``: no frame
    connections, every client stays on gRPC)."""
    value = os.environ.get(ENV_FRAME_PORT, "0").strip().lower()
    if value in ("off", "none", "no", "false"):
        return None
    if not value.isdigit() or int(value) > 65535:
        raise ValueError(f"{ENV_FRAME_PORT} must be a port number or 'off', not {value!r}")
    return int(value)


class FrameServer:
    """The frame connections of one ``QueuesService``."""

    def __init__(self, queues: QueuesService, auth: Authenticator) -> None:
        self.queues = queues
        self.auth = auth
        self.server_id = secrets.token_hex(8)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()

    async def start(self, host: str, port: int = 0) -> int:
        """Listen on ``host`` (port 0: any free one) and offer it in the Stream's headers."""
        loop = asyncio.get_running_loop()
        sock = await bind_listener(host, port, "frame connections")
        self._server = await loop.create_server(lambda: _Connection(self), sock=sock)
        self.port = sock.getsockname()[1]
        self.queues.frame_offer = ((FRAME_PORT_KEY, str(self.port)),
                                   (FRAME_ID_KEY, self.server_id))
        return self.port

    async def stop(self, grace: float) -> None:
        """No new connections; those open end once drained (the caller drains the service's
        sessions first), or are cut after ``grace`` seconds."""
        self.queues.frame_offer = ()
        if self._server is not None:
            self._server.close()
        ended = [c.ended for c in self._connections]
        if ended:
            await asyncio.wait(ended, timeout=grace)
        for connection in list(self._connections):
            connection.abort()

    def hello(self, data: bytes) -> pb.StreamError | tuple[tuple[str, str], ...]:
        """A connection's first message: its metadata, or why it is refused."""
        try:
            metadata = dict(pb.FrameHello.FromString(data).metadata)
        except DecodeError:
            return _refusal(grpc.StatusCode.INVALID_ARGUMENT, "InvalidParameterValue",
                            "The first message on a frame connection must be a FrameHello.")
        if metadata.get(FRAME_ID_KEY, self.server_id) != self.server_id:
            return _refusal(grpc.StatusCode.UNAVAILABLE, "",
                            f"This frame port belongs to another server now; {NOT_RUN}.")
        if self.queues.draining:
            return _refusal(grpc.StatusCode.UNAVAILABLE, "",
                            f"The server is shutting down; {NOT_RUN}.")
        try:
            self.auth.verify_grpc_token(metadata.get(GRPC_METADATA_KEY), STREAM_METHOD)
        except AuthError as e:
            return _refusal(e.grpc_status, e.code, e.message)
        return tuple((k, v) for k, v in metadata.items() if k != FRAME_ID_KEY)


def _refusal(status: grpc.StatusCode, code: str, message: str) -> pb.StreamError:
    return error_reply(status, code, message).error


class _Connection(asyncio.BufferedProtocol):
    """One client's connection: its bytes in, its session's reply frames out. The replies
    ready in one turn of the event loop leave in one frame, written by a callback at the
    end of that turn (``StreamSession.on_reply``).

    It reads into a buffer of its own (``recv_into``): asyncio's plain protocols read with
    ``recv(256 KiB)``, a fresh buffer of that size each time, which glibc maps, shrinks and
    unmaps again (three system calls and a page fault: 11 us of a read's 13 measured here,
    on every frame a client sends)."""

    def __init__(self, server: FrameServer) -> None:
        self._server = server
        self._splitter = FrameSplitter()
        self._buffer = memoryview(bytearray(READ_BUFFER_BYTES))
        self._transport: asyncio.Transport | None = None
        self._session: StreamSession | None = None
        self._refused = False
        self._flush_due = False
        self._can_write = True  # the transport's buffer is below its high-water mark
        self._reading = True
        self._loop = asyncio.get_running_loop()
        self.ended: asyncio.Future = self._loop.create_future()
        self._hello_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self._server._connections.add(self)
        self._hello_timer = self._loop.call_later(HELLO_TIMEOUT_S, self._no_hello)

    def _no_hello(self) -> None:  # (the timer is cancelled when the hello comes)
        log.warning("frame connection cut off: no hello within %g s", HELLO_TIMEOUT_S)
        self.abort()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._buffer[:nbytes])  # (the splitter copies what it keeps)

    def data_received(self, data: bytes | memoryview) -> None:
        if self._refused:
            return
        try:
            for message in self._splitter.feed(data):
                if self._session is None:
                    self._open(message)
                    if self._refused:
                        return
                else:
                    self._session.received(pb.StreamRequestFrame.FromString(message))
        except (FrameError, DecodeError) as e:
            log.warning("frame connection cut off: %s", e)
            self.abort()
            return
        if self._session is not None and self._session.in_flight >= MAX_CALLS_PER_CONNECTION:
            self._pause_reading()

    def _open(self, message: bytes) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        hello = self._server.hello(message)
        if isinstance(hello, pb.StreamError):
            self._refused = True
            self._transport.write(framed(pb.StreamReplyFrame(refused=hello)))  # type: ignore[union-attr]
            self._transport.close()  # type: ignore[union-attr]
            return
        self._session = self._server.queues.open_session(hello)
        self._session.on_reply = self._reply_ready
        self._transport.write(framed(pb.StreamReplyFrame()))  # type: ignore[union-attr]  # accepted

    def _reply_ready(self) -> None:
        session = self._session
        if session is not None and session.in_flight == 1 and not session.starting and \
                self._can_write:
            # The only call on the connection (it ends once this returns): no other
            # reply could share its write, so it leaves now rather than a loop turn later,
            # as a lone caller's call did (that turn is one the caller waits through).
            self._flush()
            return
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Write the replies ready, as few frames as they fit in; end the connection once
        the session has (every call answered after the client half-closed)."""
        self._flush_due = False
        session, transport = self._session, self._transport
        if session is None or transport is None or self.ended.done():
            return
        while self._can_write and session.has_replies():
            frame, ended = session.take_frame()
            if frame is not None:
                transport.write(_LENGTH.pack(len(frame)) + frame)  # (framed, as bytes)
            if ended:
                transport.close()
                self._finish()
                return
        if not self._reading and session.in_flight < MAX_CALLS_PER_CONNECTION // 2:
            self._reading = True
            transport.resume_reading()

    def _finish(self) -> None:
        if self._session is not None:
            self._server.queues.close_session(self._session)
        if not self.ended.done():
            self.ended.set_result(None)

    def eof_received(self) -> bool:
        if self._session is not None:
            self._session.input_ended()  # the replies still go out
            return True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self._server._connections.discard(self)
        if self._session is not None and not self.ended.done():
            self._session.cancel_calls()  # nobody to answer
        self._finish()

    def pause_writing(self) -> None:
        self._can_write = False

    def resume_writing(self) -> None:
        self._can_write = True
        self._reply_ready()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._transport.pause_reading()  # type: ignore[union-attr]
