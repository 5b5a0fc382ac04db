"""The server side of the multiplexed stream (``Queues.Stream``): many calls, one gRPC stream
(or one frame connection, ``sqsq.gateway.frames``, which drives a session the same way).

Each request read from the stream runs as a call of its own, driven like a task that starts
at once (``EagerCall``: a long poll holds only its own), through the handler its unary
method runs, with a context whose metadata is the stream's (the authorization token, checked
once when the stream opened) followed by the call's own (region, shard). Its reply carries
its id. Replies ready together leave in one frame: a gRPC message costs far more here than a
protobuf one, so under load many calls share one. The session ends when the client
half-closes and every call is answered.

On shutdown the server drains it: it tells the client (a frame with ``draining``), which
sends nothing more on it and half-closes; calls under way finish, and a request that was
already on its way is answered UNAVAILABLE "not run" (``sqsq.wire.NOT_RUN``), which any
client may send again. The server reads until the half-close, so no call is left without
an answer (a client that never half-closes is cut off by the gRPC server's stop grace).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from sqsq.gateway.eagercall import EagerCall
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import MAX_FRAME_BYTES, NOT_RUN
from sqsq.wire import varint as _varint

# MAX_FRAME_BYTES is what gRPC lets a client receive by default: a frame past it would end
# the whole stream, so a reply too large for a frame of its own ends only its call
# (RESOURCE_EXHAUSTED, as the unary call would).
FRAME_OVERHEAD = 6  # per reply in a frame: its tag and length
MAX_REPLY_BYTES = MAX_FRAME_BYTES - FRAME_OVERHEAD
MAX_FRAME_REPLIES = 256
_DRAINING = object()  # in the reply queue: tell the client, in the next frame
Metadata = Sequence[tuple[str, Any]]
# kind (the oneof field, the unary method in snake case), request, context -> its reply,
# serialized, without its id (``result_bytes``)
CallFn = Callable[[str, Any, "CallContext"], Awaitable[bytes]]

# Replies travel as bytes: each is serialized once, when it is ready, and a frame is its
# replies' bytes one after the other, each behind its field's tag and length (what a
# repeated message field is on the wire). Building a frame as a message copied every reply
# into it (and a call's response into its reply) before serializing it all again.
_REPLIES_TAG = bytes([pb.StreamReplyFrame.DESCRIPTOR.fields_by_name["replies"].number << 3 | 2])
_DRAINING_FIELD = pb.StreamReplyFrame(draining=True).SerializeToString()
_ID_TAG = bytes([pb.StreamReply.DESCRIPTOR.fields_by_name["id"].number << 3])  # a varint


# kind -> the tag of the reply's field of that name (a message: length-delimited)
_RESULT_TAGS = {f.name: _varint(f.number << 3 | 2) for f in pb.StreamReply.DESCRIPTOR.fields
                if f.containing_oneof is not None}


def result_bytes(kind: str, response: Any) -> bytes:
    """A call's reply, serialized without its id: ``response`` in the reply's field ``kind``
    (the bytes ``StreamReply`` with that field set serializes to)."""
    body = response.SerializeToString()
    return _RESULT_TAGS[kind] + _varint(len(body)) + body


class Aborted(Exception):
    """A call off a stream ended as ``context.abort`` ends a unary one."""

    def __init__(self, status: grpc.StatusCode, details: str, trailing: Metadata) -> None:
        super().__init__(details)
        self.status, self.details, self.trailing = status, details, trailing

    def reply(self, error_code_key: str) -> pb.StreamReply:
        code = next((str(v) for k, v in self.trailing if k == error_code_key), "")
        return error_reply(self.status, code, self.details)


class CallContext:
    """What the unary handlers use of a gRPC servicer context: the metadata, and ``abort``
    (which here raises ``Aborted`` for the stream to turn into the call's reply)."""

    __slots__ = ("_metadata",)

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Metadata = ()) -> None:
        raise Aborted(code, details, trailing_metadata)


def error_reply(status: grpc.StatusCode, code: str, message: str) -> pb.StreamReply:
    """A failed call's reply: what the unary call would have ended with."""
    return pb.StreamReply(error=pb.StreamError(status=status.value[0], code=code,
                                               message=message))


def too_large(size: int) -> pb.StreamReply:
    """The reply to a call whose reply (``size`` bytes) would not fit in a frame."""
    return error_reply(grpc.StatusCode.RESOURCE_EXHAUSTED, "",
                       f"the response is {size} bytes, more than the "
                       f"{MAX_REPLY_BYTES} a gRPC message may carry")


class StreamSession:
    """One open stream: reads requests, runs each as a call of its own, hands out replies as
    they come.

    Replies wait in a deque. The gRPC stream's side takes them with ``reply_frames``; a frame
    connection sets ``on_reply``, which is called when a reply is queued with none waiting
    (the connection then writes the frame at the end of the event loop's turn, with every
    reply ready by then: one write per turn, not a wake-up of a writer task per reply)."""

    def __init__(self, call: CallFn, metadata: Metadata) -> None:
        self._call = call
        self._metadata = tuple(metadata)
        # a reply ready to send (serialized, its id in); _DRAINING; None: the stream ends
        self._replies: deque[Any] = deque()
        self._waiter: asyncio.Future | None = None  # reply_frames, waiting for a reply
        self.on_reply: Callable[[], None] | None = None
        self._tasks: dict[int, EagerCall] = {}
        self.starting = False  # a frame's calls are being started (``received``)
        # Calls with a deadline (loop time), and the one timer that cancels those past it:
        # set for the nearest deadline (a timer per call would cost a heap entry each).
        self._deadlines: dict[int, float] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = math.inf
        self._read_all = False  # the client half-closed
        self._closing = False  # the server drains

    async def replies(self, frames: AsyncIterator[pb.StreamRequestFrame],
                      ) -> AsyncIterator[pb.StreamReplyFrame]:
        """The gRPC stream's side: read ``frames`` while yielding the reply frames."""
        reader = asyncio.create_task(self._read(frames))
        try:
            async with contextlib.aclosing(self.reply_frames()) as replies:
                async for frame in replies:
                    yield frame
        finally:
            reader.cancel()

    async def reply_frames(self) -> AsyncIterator[pb.StreamReplyFrame]:
        """Replies as they come, those ready together in one frame, until the session ends
        (the client half-closed and every call is answered). Closing it early cancels the
        calls still running: nobody is left to answer."""
        try:
            while True:
                if not self._replies:
                    self._waiter = asyncio.get_running_loop().create_future()
                    try:
                        await self._waiter
                    finally:
                        self._waiter = None
                frame, ended = self.take_frame()
                if frame is not None:
                    yield pb.StreamReplyFrame.FromString(frame)
                if ended:
                    return
        finally:
            self.cancel_calls()

    def has_replies(self) -> bool:
        return bool(self._replies)

    def take_frame(self) -> tuple[bytes | None, bool]:
        """The replies ready now that fit in one frame, as a serialized StreamReplyFrame
        (None: none), and whether the session has ended (nothing more will come)."""
        replies = self._replies
        parts: list[bytes] | None = None
        size = 0
        count = 0
        while replies:
            ready = replies[0]
            if ready is None:
                break  # (left in place: the session stays ended)
            if parts is None:
                parts = []
                size = FRAME_OVERHEAD
            if ready is _DRAINING:
                replies.popleft()
                parts.append(_DRAINING_FIELD)
                continue
            n = len(ready)
            if count and (count >= MAX_FRAME_REPLIES or
                          size + n + FRAME_OVERHEAD > MAX_FRAME_BYTES):
                break
            replies.popleft()
            parts += (_REPLIES_TAG, _varint(n), ready)
            size += n + FRAME_OVERHEAD
            count += 1
        frame = None if parts is None else b"".join(parts)
        return frame, bool(replies) and replies[0] is None

    def cancel_calls(self) -> None:
        """Nobody is left to answer: the calls still running are cancelled."""
        self._stop_expiry()
        for task in list(self._tasks.values()):
            task.cancel()

    def _stop_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()  # (the session is done: the loop holds it no longer)
            self._expiry, self._expiry_at = None, math.inf

    def _put(self, item: Any) -> None:
        replies = self._replies
        replies.append(item)
        if len(replies) == 1:
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            if self.on_reply is not None:
                self.on_reply()

    @property
    def in_flight(self) -> int:
        """Calls running."""
        return len(self._tasks)

    def received(self, frame: pb.StreamRequestFrame) -> None:
        """A frame of calls from the client: each starts at once, its first step run now
        (``EagerCall``). While they start, ``starting`` is set: a reply one of them has at
        once waits for the end of the turn with the others' (one write for the frame, not
        one per call)."""
        calls = frame.calls
        if len(calls) == 1:
            self._start(calls[0])
            return
        self.starting = True
        try:
            for request in calls:
                self._start(request)
        finally:
            self.starting = False

    def input_ended(self) -> None:
        """The client half-closed (or the connection broke): the session ends once every
        call is answered."""
        self._read_all = True
        self._end_if_idle()

    def drain(self) -> None:
        """Finish the calls under way, run no more, ask the client to half-close; the stream
        ends once it has and every call is answered."""
        if not self._closing:
            self._closing = True
            self._put(_DRAINING)

    def _end_if_idle(self) -> None:
        if self._read_all and not self._tasks:
            self._stop_expiry()
            self._put(None)

    async def _read(self, frames: AsyncIterator[pb.StreamRequestFrame]) -> None:
        try:
            async for frame in frames:
                self.received(frame)
        except (asyncio.CancelledError, Exception):  # noqa: BLE001
            pass  # the stream broke or ended under the reader: replies() ends too
        finally:
            self.input_ended()

    def _start(self, request: pb.StreamRequest) -> None:
        kind = request.WhichOneof("call")
        if kind == "cancel":
            task = self._tasks.get(request.id)
            if task is not None:
                task.cancel()
            return
        refusal = self._refusal(request, kind)
        if refusal is not None:
            refusal.id = request.id
            self._put(refusal.SerializeToString())
            return
        metadata = self._metadata
        if request.metadata:
            metadata = metadata + tuple(request.metadata.items())
        loop = asyncio.get_running_loop()
        call = EagerCall(loop, self._run(request.id, kind, getattr(request, kind),
                                         CallContext(metadata)))
        self._tasks[request.id] = call
        if request.timeout_ms:  # the caller stops waiting then: so does the call
            deadline = loop.time() + request.timeout_ms / 1000
            self._deadlines[request.id] = deadline
            if deadline < self._expiry_at:
                self._expire_at(loop, deadline)
        call.start()

    def _expire_at(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = when
        self._expiry = loop.call_at(when, self._expire)

    def _expire(self) -> None:
        """Cancel the calls past their deadline; wait for the next one."""
        self._expiry, self._expiry_at = None, math.inf
        loop = asyncio.get_running_loop()
        now = loop.time()
        nearest = math.inf
        for call_id, deadline in list(self._deadlines.items()):
            if deadline <= now:
                del self._deadlines[call_id]
                task = self._tasks.get(call_id)
                if task is not None:
                    task.cancel()
            elif deadline < nearest:
                nearest = deadline
        if nearest < math.inf:
            self._expire_at(loop, nearest)

    def _refusal(self, request: pb.StreamRequest, kind: str | None) -> pb.StreamReply | None:
        if self._closing:
            return error_reply(grpc.StatusCode.UNAVAILABLE, "ServiceUnavailable",
                               f"The server is shutting down; {NOT_RUN}.")
        if kind is None:
            return error_reply(grpc.StatusCode.INVALID_ARGUMENT, "InvalidParameterValue",
                               "A stream request must carry a call.")
        if request.id in self._tasks:
            return error_reply(grpc.StatusCode.INVALID_ARGUMENT, "InvalidParameterValue",
                               f"Call id {request.id} is already in use on this stream.")
        return None

    async def _run(self, call_id: int, kind: str, request: Any, context: CallContext) -> None:
        try:
            result = await self._call(kind, request, context)
            # (the id first, as the message serializes it; an id of 0 is no field at all)
            reply = _ID_TAG + _varint(call_id) + result if call_id else result
            if len(reply) > MAX_REPLY_BYTES:
                refusal = too_large(len(reply))
                refusal.id = call_id
                reply = refusal.SerializeToString()
            self._put(reply)
        except asyncio.CancelledError:
            pass  # abandoned by its caller (deadline or cancel): nobody waits for a reply
        finally:
            del self._tasks[call_id]
            # The expiry timer stays set when no deadline is left: it finds nothing when it
            # fires, and the next call's deadline, later than it, needs no timer of its own
            # (cancelled here, each lone call cost a timer made, pushed and cancelled).
            self._deadlines.pop(call_id, None)
            self._end_if_idle()
