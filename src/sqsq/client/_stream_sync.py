"""Blocking calls over one long-lived gRPC stream per channel: the ``sqsq.client.sync``
side of ``sqsq.client._stream`` (whose docstring gives the contract both keep), and what a
blocking frame connection (``sqsq.client._frames``) shares with it: callers wait on a lock
each, and one reader thread per connection fills them in."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from sqsq.client._stream import (
    _NOTHING,
    ACCEPT_WAIT_S,
    Metadata,
    Outgoing,
    _abandoned,
    _cancel,
    _deadline_exceeded,
    _ended,
    _frame,
    _request,
    _response,
    _serializers,
)
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import STREAM_METHOD

# How long closing a blocking client waits for a connection's reader thread to end.
CLOSE_WAIT_S = 5.0


class _Waiter:
    """One blocking caller's slot: a lock held until its reply (or error) is put in."""

    __slots__ = ("_lock", "reply", "error")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.reply: pb.StreamReply | None = None
        self.error: BaseException | None = None

    def put(self, reply: pb.StreamReply | None, error: BaseException | None = None) -> None:
        self.reply, self.error = reply, error
        self._lock.release()

    def wait(self, timeout: float | None) -> bool:
        return self._lock.acquire(timeout=-1 if timeout is None else timeout)


class _Closed(Exception):
    """The stream ended before the call was put on it: open another."""


class _SyncCalls:
    """Blocking calls matched to their replies by id: what a stream and a frame connection
    share. ``_put`` (called under the lock) puts a request or a cancel on the way; whoever
    pops a waiter fills it."""

    def __init__(self) -> None:
        self.pending: dict[int, _Waiter] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # done, draining, pending and the writes change together
        self.done = False
        self.draining = False  # the server asked for no more calls here
        self._reader: threading.Thread | None = None

    def _put(self, outgoing: Outgoing) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @property
    def ended(self) -> bool:
        """Its reader thread has finished: nothing of it runs any more."""
        return self._reader is not None and not self._reader.is_alive()

    def _start_reader(self, read: Callable[..., None], name: str, *args: Any) -> None:
        self._reader = threading.Thread(target=read, args=args, name=name, daemon=True)
        self._reader.start()

    def _await_reader(self) -> None:
        """Wait for the reader to end. A daemon thread still inside gRPC when the interpreter
        exits can be stopped holding a call's lock, and the exit then hangs for ever in that
        call's finalizer; a closed client leaves no thread of its own behind."""
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(CLOSE_WAIT_S)

    def call(self, field: str, body: bytes, timeout: float | None,
             metadata: Metadata, abandon: Any = None) -> Any:
        """``_AioCalls.call``, blocking."""
        waiter = _Waiter()
        with self._lock:  # sent before a half-close, or not at all
            if self.done or self.draining:
                raise _Closed
            call_id = next(self._ids)
            self.pending[call_id] = waiter
            self._put(_request(call_id, field, body, timeout, metadata))
        if abandon is not None:  # (``_abandon.Abandon``, fired from another thread)
            abandon.attach(lambda: self._abandon(call_id))
        if not waiter.wait(timeout):
            if self.pending.pop(call_id, None) is not None:
                with self._lock:
                    if not self.done:
                        self._put(_cancel(call_id))
                raise _deadline_exceeded()
            waiter.wait(None)  # being filled right now
        if waiter.error is not None:
            raise waiter.error
        return _response(waiter.reply)  # type: ignore[arg-type]

    def _abandon(self, call_id: int) -> None:
        """End a call still waiting: the server is told to stop working on it."""
        waiter = self.pending.pop(call_id, None)
        if waiter is None:
            return  # answered, or ended, already
        with self._lock:
            if not self.done:
                self._put(_cancel(call_id))
        waiter.put(None, _abandoned())

    def _deliver(self, replies: Sequence[pb.StreamReply]) -> None:
        for reply in replies:
            waiter = self.pending.pop(reply.id, None)
            if waiter is not None:
                waiter.put(reply)

    def _retire(self, half_close: Callable[[], None]) -> None:
        with self._lock:
            if not self.draining:
                self.draining = True  # new calls go elsewhere
                half_close()  # after what was sent

    def _end(self, error: Callable[[], BaseException]) -> None:
        with self._lock:
            self.done = True
            pending, self.pending = self.pending, {}
        for waiter in pending.values():
            waiter.put(None, error())


class _SyncStream(_SyncCalls):
    """One open stream: gRPC's own thread writes the requests queued here; a reader thread
    hands each reply to the waiter for its id, after giving ``on_headers`` the server's
    headers."""

    def __init__(self, channel: grpc.Channel, metadata: Sequence[tuple[str, str]],
                 on_headers: Callable[[_SyncStream, dict[str, str]], None] | None = None,
                 ) -> None:
        super().__init__()
        self._outbox: queue.SimpleQueue[Outgoing | None] = queue.SimpleQueue()
        self._on_headers = on_headers
        self._sent = False  # a frame went to gRPC: its calls may have reached the server
        self._accepted = threading.Event()  # the server's headers came, or the stream ended
        self._replies = channel.stream_stream(STREAM_METHOD, **_serializers())(
            self._requests(), metadata=metadata)
        self._start_reader(self._read, "sqsq-stream", self._replies)

    def _requests(self) -> Iterator[bytes]:
        """Frames for gRPC's request thread, until None (the stream ended). None before the
        server accepted the stream (its headers; after ``ACCEPT_WAIT_S`` for a server that
        sends them only with its first reply), as ``_AioStream`` writes: a stream that ends
        as it opens (a server stopping) then took none of the calls, and they may be made
        again."""
        self._accepted.wait(ACCEPT_WAIT_S)
        held: Any = _NOTHING
        while True:
            first = self._outbox.get() if held is _NOTHING else held
            if first is None or self.done:
                return
            frame, held = _frame(first, self._outbox.get_nowait)
            self._sent = True
            yield frame

    def _put(self, outgoing: Outgoing) -> None:
        self._outbox.put(outgoing)

    def retire(self) -> None:
        """No new calls here (they go elsewhere); half-close after those sent."""
        self._retire(lambda: self._outbox.put(None))

    def close(self) -> None:
        """Cancel the stream and wait for its reader; the call object is let go here too, so
        its finalizer runs now and not at the interpreter's exit."""
        replies, self._replies = self._replies, None
        if replies is not None:
            replies.cancel()
        self._await_reader()

    def _read(self, replies: Any) -> None:
        err: grpc.RpcError | None = None
        try:
            headers = replies.initial_metadata() or ()
            if not replies.done():  # (one that ended as it opened has only its trailers)
                self._accepted.set()
            if self._on_headers is not None:
                self._on_headers(self, {k: str(v) for k, v in headers})
            for frame in replies:
                self._deliver(frame.replies)
                if frame.draining:
                    self.retire()
        except grpc.RpcError as e:
            err = e
            # The call is its own exception: its traceback's frames hold the call, a cycle
            # only the collector ends, maybe at the interpreter's exit (see ``close``).
            e.__traceback__ = None
        finally:
            self._end(lambda: _ended(err, self._sent))
            self._accepted.set()  # (done: the request thread sends nothing more)
            self._outbox.put(None)  # ends gRPC's request thread
            replies.cancel()
