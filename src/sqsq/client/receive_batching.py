"""Coalescing concurrent ``receive_message`` calls (part of the SDK's automatic batching).

Many consumers receive one message per call. While a receive of a queue is in flight, later
receives of that queue with the same parameters wait; when a slot frees, the waiting ones go
as one ReceiveMessage asking for the sum of what they asked (at most 10), and the messages
are dealt out in call order, each caller getting at most what it asked for. So no message is
received that no caller asked for, and a lone receive goes out at once, as itself.

A caller that got nothing keeps waiting for its own long poll to end, as SQS would have kept
it waiting: it goes again with the next receive, asking only for the wait it has left. Only
receives that say how long they wait (``wait_time_seconds``) are coalesced, of standard
queues, without a receive request attempt id: a FIFO queue's receive is about order and
retries of one caller, and without a wait the queue's default, unknown here, would apply.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from sqsq.client._call import RECEIVE_DEADLINE_MARGIN, Call
from sqsq.errors import QueueError, error_for

SQS_MAX_MESSAGES = 10
Clock = Callable[[], float]


def coalescable(call: Call) -> bool:
    req = call.request
    return (call.method == "ReceiveMessage" and req.HasField("wait_time_seconds")
            and not req.receive_request_attempt_id
            and not req.queue_url.rstrip("/").endswith(".fifo"))


def lane_key(call: Call) -> tuple[str, bytes]:
    """Receives that may share a call: everything equal but how many and how long."""
    req = type(call.request)()
    req.CopyFrom(call.request)
    req.ClearField("max_number_of_messages")
    req.ClearField("wait_time_seconds")
    return call.region or "", req.SerializeToString(deterministic=True)


class _Receiver:
    __slots__ = ("call", "wants", "deadline", "got", "error", "done", "future", "leads")

    def __init__(self, call: Call, now: float) -> None:
        self.call = call
        self.wants = max(1, min(SQS_MAX_MESSAGES, call.request.max_number_of_messages or 1))
        self.deadline = now + max(0, call.request.wait_time_seconds)
        self.got: list[Any] | None = None
        self.error: BaseException | None = None
        self.done: threading.Event | None = None
        self.future: asyncio.Future | None = None
        self.leads: list[_Receiver] | None = None  # (sync) the batch this caller must send


class _Lane:
    __slots__ = ("pending", "in_flight", "limit")

    def __init__(self, limit: int) -> None:
        self.pending: deque[_Receiver] = deque()
        self.in_flight = 0
        self.limit = limit

    def take(self) -> list[_Receiver] | None:
        """The next receives to send together, if a slot is free."""
        if not self.pending or self.in_flight >= self.limit:
            return None
        batch = [self.pending.popleft()]
        total = batch[0].wants
        while self.pending and total + self.pending[0].wants <= SQS_MAX_MESSAGES:
            total += self.pending[0].wants
            batch.append(self.pending.popleft())
        self.in_flight += 1
        return batch


def combined(batch: list[_Receiver], now: float) -> Call:
    """One receive for the batch: the sum of what they want, the shortest wait they have
    left (a caller with more left goes again if this one brings it nothing)."""
    first = batch[0].call
    req = type(first.request)()
    req.CopyFrom(first.request)
    req.max_number_of_messages = sum(r.wants for r in batch)
    wait = max(0, math.ceil(min(r.deadline for r in batch) - now - 0.05))
    req.wait_time_seconds = wait
    return dataclasses.replace(first, request=req, min_timeout=wait + RECEIVE_DEADLINE_MARGIN)


def deal(batch: list[_Receiver], messages: list[Any], now: float
         ) -> tuple[list[_Receiver], list[_Receiver]]:
    """Hand out ``messages`` in call order; (callers answered, callers to go again)."""
    answered, again = [], []
    it = iter(messages)
    for r in batch:
        share = [m for _, m in zip(range(r.wants), it, strict=False)]
        if share or r.deadline <= now + 0.05:
            r.got = share
            answered.append(r)
        else:
            again.append(r)
    return answered, again


def fail(batch: list[_Receiver], err: BaseException) -> None:
    """A failed receive fails each caller in it, each with an exception of its own."""
    for i, r in enumerate(batch):
        r.error = err if i == 0 or not isinstance(err, QueueError) else error_for(
            err.code, err.message)


class ReceiveCoalescer:
    """For the blocking ``Client``: ``receive(call)`` from any thread."""

    def __init__(self, run: Callable[[Call], Any], max_in_flight: int,
                 clock: Clock = time.monotonic) -> None:
        self._run = run
        self._limit = max_in_flight
        self._clock = clock
        self._lock = threading.Lock()
        self._lanes: dict[tuple[str, bytes], _Lane] = {}

    def receive(self, call: Call) -> list[Any]:
        if not coalescable(call):
            return self._run(call)
        me = _Receiver(call, self._clock())
        me.done = threading.Event()
        key = lane_key(call)
        with self._lock:
            lane = self._lanes.setdefault(key, _Lane(self._limit))
            lane.pending.append(me)
            self._lead(lane)
        while True:
            me.done.wait()
            if me.leads is None:
                break
            batch, me.leads = me.leads, None
            me.done.clear()
            self._send(key, lane, batch)
        if me.error is not None:
            raise me.error
        assert me.got is not None
        return me.got

    def _lead(self, lane: _Lane) -> None:
        """(Under the lock.) Wake the first caller of each batch that may go now to send it."""
        while (batch := lane.take()) is not None:
            batch[0].leads = batch
            assert batch[0].done is not None
            batch[0].done.set()

    def _send(self, key: tuple[str, bytes], lane: _Lane, batch: list[_Receiver]) -> None:
        again: list[_Receiver] = []
        try:
            messages = self._run(combined(batch, self._clock()))
            answered, again = deal(batch, messages, self._clock())
        except BaseException as err:  # every caller gets it
            fail(batch, err)
            answered = batch
        with self._lock:
            lane.in_flight -= 1
            lane.pending.extendleft(reversed(again))
            self._lead(lane)
            if not lane.pending and not lane.in_flight:
                self._lanes.pop(key, None)
        for r in answered:
            assert r.done is not None
            r.done.set()


class AsyncReceiveCoalescer:
    """For ``AsyncClient``: ``await receive(call)`` on the client's loop."""

    def __init__(self, run: Callable[[Call], Awaitable[Any]], max_in_flight: int,
                 clock: Clock = time.monotonic) -> None:
        self._run = run
        self._limit = max_in_flight
        self._clock = clock
        self._lanes: dict[tuple[str, bytes], _Lane] = {}
        self._tasks: set[asyncio.Task] = set()

    async def receive(self, call: Call) -> list[Any]:
        if not coalescable(call):
            return await self._run(call)
        me = _Receiver(call, self._clock())
        me.future = asyncio.get_running_loop().create_future()
        key = lane_key(call)
        lane = self._lanes.setdefault(key, _Lane(self._limit))
        lane.pending.append(me)
        batches = self._take(key, lane)
        if batches and batches[0] == [me]:  # nothing was waiting: it goes now, from here
            self._spawn(key, lane, batches[1:])
            try:
                return await self._run(call)
            finally:
                lane.in_flight -= 1
                self._spawn(key, lane, self._take(key, lane))
        self._spawn(key, lane, batches)
        try:
            return await me.future
        except asyncio.CancelledError:
            if me in lane.pending:
                lane.pending.remove(me)
            raise

    def _take(self, key: tuple[str, bytes], lane: _Lane) -> list[list[_Receiver]]:
        batches = []
        while (batch := lane.take()) is not None:
            batches.append(batch)
        if not lane.pending and not lane.in_flight:
            self._lanes.pop(key, None)
        return batches

    def _spawn(self, key: tuple[str, bytes], lane: _Lane,
               batches: list[list[_Receiver]]) -> None:
        for batch in batches:
            task = asyncio.ensure_future(self._send(key, lane, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, key: tuple[str, bytes], lane: _Lane, batch: list[_Receiver]) -> None:
        batch = [r for r in batch if r.future is not None and not r.future.done()]
        again: list[_Receiver] = []
        try:
            if batch:
                messages = await self._run(combined(batch, self._clock()))
                answered, again = deal(batch, messages, self._clock())
            else:
                answered = []
        except BaseException as err:  # its callers get it (cancelled: the loop ends)
            fail(batch, err)
            answered = batch
        finally:
            lane.in_flight -= 1
        lane.pending.extendleft(reversed(again))
        self._spawn(key, lane, self._take(key, lane))
        for r in answered:
            fut = r.future
            assert fut is not None
            if fut.done():
                continue  # its caller gave up (what it was dealt stays in flight, as it would)
            if isinstance(r.error, asyncio.CancelledError):
                fut.cancel()
            elif r.error is not None:
                fut.set_exception(r.error)
            else:
                fut.set_result(r.got)

    async def wait_idle(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
