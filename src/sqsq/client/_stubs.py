"""The stubs the clients call through: ``QueuesStub``'s method names over one gRPC stream per
channel (``sqsq.client._stream``), moved to the server's frame connection when its stream
headers offer one and it can be reached (``sqsq.client._frames``).

Either way a call keeps the unary API's contract, so ``_call.Route``'s retry rules apply
unchanged; a server without the stream gets unary calls, and a request too large for one
frame goes unary, where the size error is its own.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import grpc
import grpc.aio

from sqsq.client import _auth, _frames
from sqsq.client._stream import (
    FIELDS,
    MAX_REQUEST_BYTES,
    Metadata,
    _AioCalls,
    _AioStream,
    _token,
    _Unimplemented,
)
from sqsq.client._stream_sync import _Closed, _SyncCalls, _SyncStream
from sqsq.v1 import queues_pb2_grpc

log = logging.getLogger("sqsq.client")


class _Method:
    __slots__ = ("_stub", "_name")

    def __init__(self, stub: Any, name: str) -> None:
        self._stub, self._name = stub, name

    def __call__(self, request: Any, timeout: float | None = None, metadata: Metadata = None,
                 abandon: Any = None, **_: Any) -> Any:
        return self._stub.call(self._name, request, timeout, metadata, abandon)


class _StubBase:
    """What both stubs share: ``QueuesStub``'s method names, the unary stub they fall back
    to, the stream they open at the first call, and the frame connection a stream's headers
    offer (for a ``target`` that is a host and port): new calls move to it and the gRPC
    stream half-closes; if it cannot be opened, the stub stays on gRPC."""

    def __init__(self, channel: Any, credentials: _auth.Credentials | None,
                 target: str) -> None:
        self._channel = channel
        self._creds = credentials
        self._target = target
        self._unary = queues_pb2_grpc.QueuesStub(channel)
        self._stream: Any = None
        self._offer: _frames.Offer | None = None  # offered, not yet opened
        self._frames_failed = False
        self.unary_only = False  # the server has no stream
        self.streams_opened = 0
        for name in FIELDS:
            setattr(self, name, _Method(self, name))

    @property
    def in_flight(self) -> int:
        """Calls on the stream waiting for their replies."""
        return 0 if self._stream is None else len(self._stream.pending)

    def _take_offer(self) -> _frames.Offer | None:
        offer, self._offer = self._offer, None  # once: after a break, gRPC says where now
        return offer

    def _no_frames(self, offer: _frames.Offer, error: _frames.FramesUnavailable) -> None:
        """Calls go on a gRPC stream that offers nothing; out of reach, frames are not tried
        again (a refusal may pass: the next stream opened may offer them again)."""
        self._frames_failed = self._frames_failed or not error.refused
        log.info("no frame connection to %s:%d (%s): calls stay on the gRPC stream",
                 offer.host, offer.port, error)

    def _offered(self, stream: Any, headers: dict[str, str]) -> None:
        """A gRPC stream's headers: if they offer a frame connection, new calls go there."""
        # (Not "is it the current stream": a blocking stream's reader may get here before
        # the stub has stored it.)
        if self._frames_failed or not _frames.enabled() or stream.done:
            return
        offer = _frames.Offer.read(self._target, headers)
        if offer is not None:
            self._offer = offer
            stream.retire()  # its calls are answered; new ones go to the frame connection


class AsyncStreamStub(_StubBase):
    """``QueuesStub`` for a ``grpc.aio`` channel. Create it inside the running event loop
    (the stream opens at the first call)."""

    _stream: _AioCalls | None

    def __init__(self, channel: grpc.aio.Channel,
                 credentials: _auth.Credentials | None = None, target: str = "") -> None:
        super().__init__(channel, credentials, target)
        self._opening: asyncio.Future | None = None
        self._open_streams: set[_AioCalls] = set()  # a retired stream may still be answering

    async def close(self) -> None:
        await asyncio.gather(*(stream.close() for stream in list(self._open_streams)))

    async def call(self, method: str, request: Any, timeout: float | None,
                   metadata: Metadata, abandon: Any = None) -> Any:
        body = request.SerializeToString()  # (once: the stream's frame takes these bytes)
        if not self.unary_only and len(body) <= MAX_REQUEST_BYTES:
            stream = self._stream
            if stream is None or stream.done or stream.draining:
                stream = await self._open()
            try:
                return await stream.call(FIELDS[method], body, timeout, metadata, abandon)
            except _Unimplemented:
                self.unary_only = True
        return await getattr(self._unary, method)(request, timeout=timeout, metadata=metadata)

    async def _open(self) -> _AioCalls:
        if self._offer is None:
            return self._opened(_AioStream(self._channel, _token(self._creds), self._offered))
        opening = self._opening  # calls that find it opening wait for the same connection
        if opening is None:
            opening = self._opening = asyncio.ensure_future(self._open_frames())
            opening.add_done_callback(lambda _: setattr(self, "_opening", None))
        return await asyncio.shield(opening)

    async def _open_frames(self) -> _AioCalls:
        offer = self._take_offer()
        assert offer is not None
        try:
            return self._opened(await _frames.AioFrameStream.open(offer, _token(self._creds)))
        except _frames.FramesUnavailable as e:
            self._no_frames(offer, e)
            return self._opened(_AioStream(self._channel, _token(self._creds)))

    def _opened(self, stream: _AioCalls) -> _AioCalls:
        self._stream = stream
        self.streams_opened += 1
        self._open_streams = {s for s in self._open_streams if not s.done}
        self._open_streams.add(stream)
        return stream


class AioChannel:
    """A ``grpc.aio`` channel whose ``close()`` first ends the stub's streams, so that gRPC
    answers their last reads while the event loop still runs; otherwise the channel."""

    def __init__(self, channel: grpc.aio.Channel, stub: AsyncStreamStub) -> None:
        self._channel, self._stub = channel, stub

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    async def close(self, grace: float | None = None) -> None:
        await self._stub.close()
        await self._channel.close(grace)


class StreamStub(_StubBase):
    """``QueuesStub`` for a blocking channel; safe to share between threads (the stream
    opens at the first call)."""

    _stream: _SyncCalls | None

    def __init__(self, channel: grpc.Channel,
                 credentials: _auth.Credentials | None = None, target: str = "") -> None:
        super().__init__(channel, credentials, target)
        self._open_lock = threading.Lock()
        # Every stream whose reader may still run: a retired one finishes its calls after
        # the next has taken over, and closing the stub ends those too.
        self._live: list[_SyncCalls] = []

    def close(self) -> None:
        with self._open_lock:
            live, self._live = self._live, []
        for stream in live:
            stream.close()

    def _open(self) -> _SyncCalls:
        with self._open_lock:
            if self._stream is None or self._stream.done or self._stream.draining:
                self._stream = self._new_stream()
                self.streams_opened += 1
                self._live = [s for s in self._live if not s.ended] + [self._stream]
            return self._stream

    def _new_stream(self) -> _SyncCalls:
        offer = self._take_offer()
        if offer is not None:
            try:
                return _frames.SyncFrameStream.open(offer, _token(self._creds))
            except _frames.FramesUnavailable as e:
                self._no_frames(offer, e)
                return _SyncStream(self._channel, _token(self._creds))
        return _SyncStream(self._channel, _token(self._creds), self._offered)

    def call(self, method: str, request: Any, timeout: float | None,
             metadata: Metadata, abandon: Any = None) -> Any:
        body = request.SerializeToString()  # (once: the stream's frame takes these bytes)
        while not self.unary_only and len(body) <= MAX_REQUEST_BYTES:
            try:
                return self._open().call(FIELDS[method], body, timeout, metadata, abandon)
            except _Closed:
                continue
            except _Unimplemented:
                self.unary_only = True
        return getattr(self._unary, method)(request, timeout=timeout, metadata=metadata)


def close_all(stubs: dict[str, tuple[Any, Any]]) -> None:
    """Close a blocking client's (channel, stub) pairs, each stub first (a stream stub ends
    its stream and its frame connection), and forget them."""
    for channel, stub in stubs.values():
        close = getattr(stub, "close", None)
        if close is not None:
            close()
        channel.close()
    stubs.clear()
