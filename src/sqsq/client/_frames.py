"""The SDK's side of the frame connection (``sqsq.gateway.frames``): the stream's messages
over plain TCP, for a server whose Stream headers offer one.

A call here keeps the stream's contract (``sqsq.client._stream``): the same requests and
replies, a broken connection fails the calls in flight UNAVAILABLE (never resent here), a
draining server gets a half-close after the calls sent. Opening it waits for the server's
acceptance; a connection that cannot be made or is refused (a firewall, another server on
the port now, credentials) raises ``FramesUnavailable`` and the stub stays on gRPC, which
reports credentials errors in its own way. Env ``SQSQ_FRAMES=0`` keeps the SDK on gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from collections import deque
from collections.abc import Mapping
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from sqsq.client._stream import (
    _NOTHING,
    CallError,
    Outgoing,
    _AioCalls,
    _frame,
)
from sqsq.client._stream_sync import _SyncCalls
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import FRAME_ID_KEY, FRAME_PORT_KEY, FrameError, FrameSplitter, framed

ENV_FRAMES = "SQSQ_FRAMES"
OPEN_TIMEOUT_S = 2.0  # to connect and be accepted; past it, gRPC
READ_BUFFER_BYTES = 262144  # what one read takes at most (asyncio's own read size)
_LENGTH = struct.Struct(">I")  # what ``sqsq.wire.framed`` puts before a message


def enabled() -> bool:
    return os.environ.get(ENV_FRAMES, "1").strip().lower() not in ("0", "false", "no", "off")


class FramesUnavailable(Exception):
    """No frame connection to this server now: use the gRPC stream. ``refused``: the server
    answered, but said no (shutting down, another server on that port now): worth trying
    again when a later stream offers one; otherwise it could not be reached."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class Offer:
    """Where a server's frame connection listens, from its Stream headers."""

    __slots__ = ("host", "port", "server_id")

    def __init__(self, host: str, port: int, server_id: str) -> None:
        self.host, self.port, self.server_id = host, port, server_id

    @classmethod
    def read(cls, target: str, headers: Mapping[str, str]) -> Offer | None:
        """The offer in ``headers`` for a channel to ``target`` (``host:port``); None if there
        is none, or the target is not a plain host and port (a name resolver's URI)."""
        port = headers.get(FRAME_PORT_KEY, "")
        host, sep, _ = target.rpartition(":")
        if not port.isdigit() or not sep or "/" in host or not host:
            return None
        return cls(host.strip("[]"), int(port), headers.get(FRAME_ID_KEY, ""))


def _hello(offer: Offer, metadata: tuple[tuple[str, str], ...]) -> pb.FrameHello:
    hello = pb.FrameHello(metadata=dict(metadata))
    hello.metadata[FRAME_ID_KEY] = offer.server_id
    return hello


def _broken(exc: BaseException | None) -> CallError:
    why = f": {exc}" if exc is not None else ""
    return CallError(grpc.StatusCode.UNAVAILABLE,
                     f"the frame connection ended before the reply{why}")


class AioFrameStream(_AioCalls):
    """One open frame connection; calls made in one turn of the event loop share a frame."""

    def __init__(self) -> None:
        super().__init__()
        self._transport: asyncio.Transport | None = None
        self._splitter = FrameSplitter()
        self._outbox: deque[Outgoing] = deque()
        self._flush_due = False
        self._eof_sent = False
        self._accepted: asyncio.Future | None = None
        self.closed: asyncio.Future | None = None

    @classmethod
    async def open(cls, offer: Offer, metadata: tuple[tuple[str, str], ...]) -> AioFrameStream:
        loop = asyncio.get_running_loop()
        stream = cls()
        stream._accepted = loop.create_future()
        stream.closed = loop.create_future()
        try:
            async with asyncio.timeout(OPEN_TIMEOUT_S):
                await loop.create_connection(lambda: _Protocol(stream), offer.host, offer.port)
                stream._transport.write(framed(_hello(offer, metadata)))  # type: ignore[union-attr]
                refused = await stream._accepted
        except (OSError, TimeoutError, FrameError) as e:
            stream._abort()
            raise FramesUnavailable(str(e)) from None
        if refused is not None:
            stream._abort()
            raise FramesUnavailable(refused.message, refused=True)
        return stream

    def _send(self, outgoing: Outgoing) -> None:
        self._outbox.append(outgoing)
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        outbox, transport = self._outbox, self._transport
        if self.done or transport is None or self._eof_sent:
            outbox.clear()  # (a cancel after the half-close: the server reads no more)
            return
        while outbox:
            frame, held = _frame(outbox.popleft(), outbox.popleft)
            if held is not _NOTHING:
                outbox.appendleft(held)
            transport.write(_LENGTH.pack(len(frame)) + frame)  # (framed, as bytes)
        if self.draining and transport.can_write_eof():
            transport.write_eof()  # the server answers what it read, then closes
            self._eof_sent = True

    def _received(self, frame: pb.StreamReplyFrame) -> None:
        accepted = self._accepted
        if accepted is not None and not accepted.done():
            accepted.set_result(frame.refused if frame.HasField("refused") else None)
            return
        self._deliver(frame.replies)
        if frame.draining:
            self.retire()  # new calls go on a new connection

    def retire(self) -> None:
        """No new calls here; half-close after those sent (the next flush does)."""
        if not self.draining:
            self.draining = True
            if not self._flush_due:
                self._flush()

    def _lost(self, exc: BaseException | None) -> None:
        accepted = self._accepted
        if accepted is not None and not accepted.done():  # closed before it said yes or no
            accepted.set_result(pb.StreamError(message="the server closed the connection"))
        self._end(lambda: _broken(exc))
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(None)

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    async def close(self) -> None:
        self._abort()
        if self.closed is not None:
            await self.closed


class _Protocol(asyncio.BufferedProtocol):
    """Reads into a buffer of its own (``recv_into``): asyncio's plain protocols read with
    ``recv(256 KiB)``, a fresh buffer of that size each time, which glibc maps, shrinks and
    unmaps again (three system calls and a page fault: 11 us of a read's 13 measured here,
    on every reply)."""

    def __init__(self, stream: AioFrameStream) -> None:
        self._stream = stream
        self._buffer = memoryview(bytearray(READ_BUFFER_BYTES))

    def connection_made(self, transport: Any) -> None:
        self._stream._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._buffer[:nbytes])  # (the splitter copies what it keeps)

    def data_received(self, data: bytes | memoryview) -> None:
        stream = self._stream
        try:
            for message in stream._splitter.feed(data):
                stream._received(pb.StreamReplyFrame.FromString(message))
        except Exception as e:  # noqa: BLE001 - not a frame: this connection is done
            stream._abort()
            stream._lost(e)

    def eof_received(self) -> bool:
        return False  # the server is done: close

    def connection_lost(self, exc: Exception | None) -> None:
        self._stream._lost(exc)


class SyncFrameStream(_SyncCalls):
    """One open frame connection for blocking callers: each call writes its own frame (under
    the lock); a reader thread hands each reply to the waiter for its id."""

    def __init__(self, sock: socket.socket, splitter: FrameSplitter) -> None:
        super().__init__()
        self._sock = sock
        self._splitter = splitter
        self._start_reader(self._read, "sqsq-frames")

    @classmethod
    def open(cls, offer: Offer, metadata: tuple[tuple[str, str], ...]) -> SyncFrameStream:
        try:
            sock = socket.create_connection((offer.host, offer.port), timeout=OPEN_TIMEOUT_S)
        except OSError as e:
            raise FramesUnavailable(str(e)) from None
        splitter = FrameSplitter()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(framed(_hello(offer, metadata)))
            messages: list[bytes] = []
            while not messages:  # the server says nothing else before the calls
                data = sock.recv(65536)
                if not data:
                    raise OSError("the server closed the frame connection")
                messages = splitter.feed(data)
            accepted = pb.StreamReplyFrame.FromString(messages[0])
            sock.settimeout(None)
        except (OSError, FrameError, DecodeError) as e:
            sock.close()
            raise FramesUnavailable(str(e)) from None
        if accepted.HasField("refused"):
            sock.close()
            raise FramesUnavailable(accepted.refused.message, refused=True)
        return cls(sock, splitter)

    def _put(self, outgoing: Outgoing) -> None:
        try:
            frame = outgoing[0]  # a frame of this one call
            self._sock.sendall(_LENGTH.pack(len(frame)) + frame)
        except OSError:
            pass  # the connection broke: the reader fails the calls

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # the reader ends, failing what waits
        self._await_reader()

    def _read(self) -> None:
        exc: BaseException | None = None
        try:
            buffer = memoryview(bytearray(READ_BUFFER_BYTES))  # (see _Protocol)
            while nbytes := self._sock.recv_into(buffer):
                for message in self._splitter.feed(buffer[:nbytes]):
                    frame = pb.StreamReplyFrame.FromString(message)
                    self._deliver(frame.replies)
                    if frame.draining:  # half-close: the server answers, then closes
                        self._retire(lambda: self._sock.shutdown(socket.SHUT_WR))
        except (OSError, FrameError, DecodeError) as e:
            exc = e
        finally:
            self._end(lambda: _broken(exc))
            self._sock.close()
