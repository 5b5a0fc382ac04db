"""Calls over one long-lived gRPC stream per channel (``Queues.Stream``): the asyncio side,
and what it shares with the blocking side (``sqsq.client._stream_sync``) and with the frame
connection (``sqsq.client._frames``); the stubs over them are in ``sqsq.client._stubs``.

A unary call costs an HTTP/2 stream and Python gRPC's per-call work on both sides (about
0.4 ms each here); on the stream a call is one protobuf message each way, matched to its
caller by an id. A call keeps the unary API's contract, so ``_call.Route``'s retry rules
apply unchanged:

- a failed call raises a ``grpc.RpcError`` with the code, details and ``sqs-error-code``
  trailer the unary call would have ended with;
- a call in flight when the stream breaks fails UNAVAILABLE (never resent here: whether it
  may be repeated is the caller's rule), with the stream's own details when it never
  connected ("failed to connect": nothing was sent), and said to be unsent when the stream
  ended before it wrote anything (a server that stops as the stream opens ends it CANCELLED
  before it ran a handler: any call may be made again); the next call opens a new stream;
- a server that drains the stream (shutting down) says so in a frame: the stub opens another
  stream for new calls and half-closes this one; every call it had sent is still answered
  (run, or refused "not run", which ``_call.may_retry`` lets any call repeat);
- a server without the stream (UNIMPLEMENTED) gets unary calls from then on, and the calls
  that met the refusal are made unary at once (the server ran none of them);
- a request too large for one gRPC message goes unary, where the size error is its own.

The stream's metadata carries the signed token (checked when it opens); a call's own
metadata (region, shard) travels in its request. Calls are written once the server has
accepted the stream (its headers; after ``ACCEPT_WAIT_S`` for a server that sends them only
with its first reply): a stream refused as it opens answers each call with the refusal's own
code. Env ``SQSQ_STREAM=0`` turns the stream off.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import queue
import re
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import grpc.aio

from sqsq.client import _auth
from sqsq.client._abandon import ABANDONED
from sqsq.client._call import ERROR_CODE_KEY, NOTHING_SENT
from sqsq.client._unclaimed import Unclaimed
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import MAX_FRAME_BYTES, STREAM_METHOD, varint

ENV_STREAM = "SQSQ_STREAM"
# MAX_FRAME_BYTES is gRPC's default limit on a received message: a frame (a gRPC message)
# never exceeds it, and a request that would not fit in a frame of its own goes unary.
MAX_REQUEST_BYTES = MAX_FRAME_BYTES - 1024
MAX_FRAME_CALLS = 256
# A server that sends no headers before its first reply (an sqsq server older than this SDK)
# gets its calls after this long anyway.
ACCEPT_WAIT_S = 1.0
_NOTHING = object()
# unary method -> its field in StreamRequest.call / StreamReply.result (snake case)
FIELDS = {name: re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()
          for name in pb.DESCRIPTOR.services_by_name["Queues"].methods_by_name
          if name != "Stream"}
_STATUS = {code.value[0]: code for code in grpc.StatusCode}
Metadata = Sequence[tuple[str, str]] | None


def enabled() -> bool:
    """Whether clients use the stream (env ``SQSQ_STREAM=0``: unary calls only)."""
    return os.environ.get(ENV_STREAM, "1").strip().lower() not in ("0", "false", "no", "off")


class CallError(grpc.RpcError):
    """A failed call off the stream, read as a unary call's error is (``_call.map_rpc_error``,
    ``_call.may_retry``): ``code()``, ``details()``, ``trailing_metadata()``."""

    def __init__(self, code: grpc.StatusCode, details: str, sqs_code: str = "") -> None:
        super().__init__(details)
        self._code, self._details, self._sqs_code = code, details, sqs_code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((ERROR_CODE_KEY, self._sqs_code),) if self._sqs_code else ()

    def __str__(self) -> str:
        return f"{self._code.name}: {self._details}"


def _abandoned() -> CallError:
    """What an abandoned call ends with (``sqsq.client._abandon``)."""
    return CallError(grpc.StatusCode.UNAVAILABLE, ABANDONED)


class _Unimplemented(Exception):
    """The server has no stream: make the call unary."""


def _reply_error(error: pb.StreamError) -> CallError:
    return CallError(_STATUS.get(error.status, grpc.StatusCode.UNKNOWN), error.message,
                     error.code)


def _sqs_code(err: grpc.RpcError | None) -> str:
    trailing_fn = getattr(err, "trailing_metadata", None)
    for key, value in (trailing_fn() if callable(trailing_fn) else None) or ():
        if key == ERROR_CODE_KEY:
            return value.decode() if isinstance(value, bytes) else str(value)
    return ""


def _ended(err: grpc.RpcError | None, sent: bool = True) -> CallError | _Unimplemented:
    """What a call in flight gets when its stream ends (``err``: how; None: it closed);
    ``sent``: whether anything was written on the stream (else no call reached the server)."""
    code = err.code() if err is not None else grpc.StatusCode.OK
    details = (err.details() if err is not None else "") or ""
    if code == grpc.StatusCode.UNIMPLEMENTED and not _sqs_code(err):
        return _Unimplemented()
    sqs_code = _sqs_code(err)
    if sqs_code:  # refused when it opened (authentication): the call's own answer
        return CallError(code, details, sqs_code)
    if not sent:  # (``_call.never_sent``: any call may be made again, anywhere)
        return CallError(grpc.StatusCode.UNAVAILABLE, f"{NOTHING_SENT} ({code.name}: {details})")
    if code == grpc.StatusCode.UNAVAILABLE:
        return CallError(code, details)
    return CallError(grpc.StatusCode.UNAVAILABLE,
                     f"the stream ended before the reply ({code.name}: {details})")


# A call for the stream, as the bytes it adds to a frame (a ``StreamRequestFrame.calls``
# entry: tag, length, the serialized StreamRequest), and their size. Requests are serialized
# once, as bytes, and a frame is its calls' bytes joined: building a StreamRequest around
# the request and a frame around those copied each request twice before serializing it all.
Outgoing = tuple[bytes, int]

_CALLS_TAG = bytes([pb.StreamRequestFrame.DESCRIPTOR.fields_by_name["calls"].number << 3 | 2])
_ID_TAG = bytes([pb.StreamRequest.DESCRIPTOR.fields_by_name["id"].number << 3])  # varints
_TIMEOUT_TAG = bytes([pb.StreamRequest.DESCRIPTOR.fields_by_name["timeout_ms"].number << 3])
# the call's field (snake case) -> its tag (length-delimited); the oneof's fields come after
# id, metadata and timeout_ms, so appended to those they are in the order protobuf writes
_CALL_TAGS = {f.name: varint(f.number << 3 | 2) for f in pb.StreamRequest.DESCRIPTOR.fields
              if f.containing_oneof is not None}
_UINT32_MAX = 0xFFFFFFFF


def _entry(message: bytes) -> Outgoing:
    part = _CALLS_TAG + varint(len(message)) + message
    return part, len(part)


def _request(call_id: int, field: str, body: bytes, timeout: float | None,
             metadata: Metadata) -> Outgoing:
    """The call ``field`` (its request serialized: ``body``) as a frame's entry."""
    timeout_ms = None if timeout is None else max(1, math.ceil(timeout * 1000))
    if metadata or call_id > _UINT32_MAX or (timeout_ms or 0) > _UINT32_MAX:
        # (rare: a region or shard of its own; or out of range, refused as protobuf would)
        head = pb.StreamRequest(id=call_id, metadata=dict(metadata or ()),
                                timeout_ms=timeout_ms or 0).SerializeToString()
    elif timeout_ms is None:
        head = _ID_TAG + varint(call_id)
    else:
        head = _ID_TAG + varint(call_id) + _TIMEOUT_TAG + varint(timeout_ms)
    return _entry(head + _CALL_TAGS[field] + varint(len(body)) + body)


def _cancel(call_id: int) -> Outgoing:
    return _entry(pb.StreamRequest(id=call_id, cancel=pb.Empty()).SerializeToString())


def _frame(first: Outgoing, take: Callable[[], Outgoing | None]) -> tuple[bytes, Any]:
    """A serialized ``StreamRequestFrame`` of ``first`` and whatever else ``take`` has ready
    that fits; and what was taken but does not fit (``_NOTHING`` if none)."""
    parts = [first[0]]
    size = first[1]
    while len(parts) < MAX_FRAME_CALLS:
        try:
            more = take()
        except (asyncio.QueueEmpty, queue.Empty, IndexError):
            break
        if more is None or size + more[1] > MAX_FRAME_BYTES:
            return b"".join(parts), more
        parts.append(more[0])
        size += more[1]
    return b"".join(parts), _NOTHING


def _response(reply: pb.StreamReply) -> Any:
    kind = reply.WhichOneof("result")
    if kind == "error":
        raise _reply_error(reply.error)
    return getattr(reply, kind)


def _deadline_exceeded() -> CallError:
    return CallError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


def _token(credentials: _auth.Credentials | None) -> tuple[tuple[str, str], ...]:
    if credentials is None:
        return ()
    return ((_auth.GRPC_METADATA_KEY, _auth.grpc_token(*credentials, STREAM_METHOD)),)


def _as_is(frame: bytes) -> bytes:
    return frame


def _serializers() -> dict[str, Callable]:
    # (frames are serialized already: ``_frame``)
    return dict(request_serializer=_as_is, response_deserializer=pb.StreamReplyFrame.FromString)


# ---- asyncio -----------------------------------------------------------------------------


class _AioCalls:
    """Calls matched to their replies by id: what a stream and a frame connection share.
    ``_send`` puts a request (or a cancel) on the way; ``_deliver`` and ``_end`` settle."""

    def __init__(self) -> None:
        self.pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self.done = False
        self.draining = False  # the server asked for no more calls here
        self.unclaimed = Unclaimed(self.call)  # receives given up on: answers released

    def _send(self, outgoing: Outgoing) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def call(self, field: str, body: bytes, timeout: float | None,
                   metadata: Metadata, abandon: Any = None) -> Any:
        """Make the call ``field`` (the unary method's, snake case) whose request serializes
        to ``body``; its response."""
        loop = asyncio.get_running_loop()
        call_id = next(self._ids)
        fut = loop.create_future()
        self.pending[call_id] = fut
        self._send(_request(call_id, field, body, timeout, metadata))
        timer = None if timeout is None else loop.call_later(timeout, _expire, fut)
        if abandon is not None:  # (``_abandon.Abandon``: fired on this loop's thread)
            abandon.attach(lambda: fut.done() or fut.set_exception(_abandoned()))
        try:
            reply = await fut
        except (asyncio.CancelledError, CallError):
            # Given up on (cancelled, or its deadline passed; not a broken stream, which
            # leaves nothing pending): the server stops working on it too.
            if self.pending.pop(call_id, None) is not None:
                if not self.done:
                    self._send(_cancel(call_id))
                    self.unclaimed.given_up(call_id, field, body, metadata)
            elif fut.done() and not fut.cancelled() and fut.exception() is None:
                self.unclaimed.arrived(field, body, metadata, fut.result())  # in, not taken
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return _response(reply)

    def _deliver(self, replies: Sequence[pb.StreamReply]) -> None:
        pending = self.pending
        for reply in replies:
            fut = pending.pop(reply.id, None)
            if fut is not None and not fut.done():
                fut.set_result(reply)
            elif fut is None:
                self.unclaimed.late(reply)

    def _end(self, error: Callable[[], BaseException]) -> None:
        """The stream is over: each call still waiting gets an ``error()`` of its own."""
        self.done = True
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(error())


class _AioStream(_AioCalls):
    """One open stream: a writer task (gRPC allows one write at a time) and a reader task
    that hands each reply to the future waiting for its id. ``on_headers`` gets the
    server's headers once it accepts the stream."""

    def __init__(self, channel: grpc.aio.Channel, metadata: Sequence[tuple[str, str]],
                 on_headers: Callable[[_AioStream, dict[str, str]], None] | None = None,
                 ) -> None:
        super().__init__()
        self._call = channel.stream_stream(STREAM_METHOD, **_serializers())(metadata=metadata)
        self._outbox: asyncio.Queue[Outgoing | None] = asyncio.Queue()  # None: half-close
        self._on_headers = on_headers
        self._accepted: asyncio.Future | None = None  # the server's headers
        self._sent = False  # a frame was written: its calls may have reached the server
        self._writer = asyncio.create_task(self._write())
        self._reader = asyncio.create_task(self._read())

    def _send(self, outgoing: Outgoing) -> None:
        self._outbox.put_nowait(outgoing)

    def retire(self) -> None:
        """No new calls here (they go elsewhere); half-close after those sent."""
        if not self.draining:
            self.draining = True
            self._outbox.put_nowait(None)

    async def close(self) -> None:
        """End the stream and wait until its last read and write are over: gRPC must not
        finish them after the event loop is gone."""
        self._call.cancel()
        waits = [self._reader, self._writer, *([self._accepted] if self._accepted else [])]
        await asyncio.gather(*waits, return_exceptions=True)

    async def _write(self) -> None:
        held: Any = _NOTHING
        try:
            # Not before the server accepted the stream (its headers) or refused it: a write
            # crossing its refusal would end the call INTERNAL in gRPC's asyncio client,
            # hiding the refusal's own code.
            self._accepted = asyncio.ensure_future(self._call.initial_metadata())
            await asyncio.wait([self._accepted], timeout=ACCEPT_WAIT_S)
            if self._call.done():
                return  # refused: the reader tells the calls why
            if self._on_headers is not None and self._accepted.done():
                self._on_headers(self, {k: str(v) for k, v in self._accepted.result() or ()})
            while True:
                first = await self._outbox.get() if held is _NOTHING else held
                if first is None:  # draining: the server reads until this half-close
                    await self._call.done_writing()
                    return
                frame, held = _frame(first, self._outbox.get_nowait)
                self._sent = True
                await self._call.write(frame)
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass  # the stream ended: the reader says how

    async def _read(self) -> None:
        err: grpc.RpcError | None = None
        try:
            while True:
                frame = await self._call.read()
                if frame is grpc.aio.EOF:
                    break
                self._deliver(frame.replies)
                if frame.draining:
                    self.retire()  # new calls go on a new stream
        except grpc.RpcError as e:
            err = e
        except asyncio.CancelledError:  # the channel closed
            err = CallError(grpc.StatusCode.CANCELLED, "the channel was closed")
        finally:
            self._writer.cancel()
            self._call.cancel()
            self._end(lambda: _ended(err, self._sent))


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(_deadline_exceeded())
