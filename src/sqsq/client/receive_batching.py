"""Concurrent ``receive_message`` calls to one standard queue, coalesced into one call
(``AsyncClient`` and ``Client``, on with ``batching``).

A consumer that runs many receive loops side by side asks for one message per call, and each
call costs the server about what a call for ten costs. Receives with the same options that
wait together go out as one ReceiveMessage asking for the sum of their
``max_number_of_messages`` (at most 10); the messages are dealt to them in turn, each getting
at most what it asked for. As for the other batched calls, coalescing is by backpressure: a
receive that finds a free slot (fewer than ``max_in_flight`` such calls under way) goes out at
the end of the current turn of the event loop, with the receives made in that turn (typically
the consumers that one batched delete has just answered); one that finds every slot busy
waits for the next, but never past its own long poll (the queue's, at most 20 s, if it gives
none): then it gets an empty list, as an expired long poll would. A short poll waits only
behind other short polls. So a lone receive goes out at once, calls grow with load, and
nothing is received before a caller asks for it (unlike prefetch). The blocking ``Client``
does the same with threads (``ThreadReceiveCoalescer``, in ``receive_batching_sync``): a
receive that finds a free slot is sent at once by its own thread, and the first waiting
caller of a batch sends it.

A caller that gets nothing from a call that returned messages to others (the queue had fewer
visible than were asked for) joins the next coalesced call while its own long poll has time
left (its ``wait_time_seconds``, counted from its call); otherwise it gets an empty list, as
an expired long poll or a short poll would. A failed call fails each of its callers. A caller
cancelled while the call is under way has the messages dealt to it made visible again.

Not coalesced: FIFO queues (the messages of a group received together must reach one
consumer, in order), calls with a receive request attempt id (a retry must get the first
call's answer), and calls asking for 10 or for an invalid count or wait (they go alone and
get the server's answer).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sqsq.client._call import Call
from sqsq.client.batching import fail_all
from sqsq.client.types import Message
from sqsq.v1 import queues_pb2 as pb

if TYPE_CHECKING:
    from sqsq.client.receive_batching_sync import _Caller

MAX_MESSAGES = 10  # one ReceiveMessage returns at most 10
MAX_WAIT_S = 20

Release = Callable[[str, list[Message]], Awaitable[None]]


class _Receiver:
    """One caller's receive while it waits for its share."""

    __slots__ = ("call", "want", "deadline", "long_poll", "future", "timer", "lane")

    def __init__(self, call: Call, want: int, deadline: float | None, long_poll: bool,
                 future: asyncio.Future) -> None:
        self.call = call
        self.want = want
        self.deadline = deadline  # (clock) when it stops waiting; None: a short poll
        self.long_poll = long_poll  # it gave a wait time above 0
        self.future = future
        self.timer: asyncio.TimerHandle | None = None  # ends its wait for a free slot
        self.lane: Lane | None = None


class Lane:
    """The receives of one queue with one set of options: waiting, and calls in flight."""

    __slots__ = ("queue", "key", "pending", "in_flight", "launching")

    def __init__(self, queue: str, key: tuple[str, tuple[str, bytes]]) -> None:
        self.queue = queue
        self.key = key
        self.pending: list[Any] = []  # _Receiver or _Caller
        self.in_flight = 0
        self.launching = False  # (asyncio) a launch is scheduled for the end of this turn


def _wanted(req: pb.ReceiveMessageRequest) -> int:
    return req.max_number_of_messages if req.HasField("max_number_of_messages") else 1


def coalescible(queue: str, call: Call) -> bool:
    """Whether a ReceiveMessage call may share a call with others (see the module doc)."""
    req = call.request
    if queue.endswith(".fifo") or req.receive_request_attempt_id:
        return False
    if req.HasField("wait_time_seconds") and not 0 <= req.wait_time_seconds <= MAX_WAIT_S:
        return False
    return 1 <= _wanted(req) < MAX_MESSAGES


def _options(call: Call) -> tuple[str, bytes]:
    """What two receives must share to be one call: every field but the count."""
    req = pb.ReceiveMessageRequest()
    req.CopyFrom(call.request)
    req.ClearField("max_number_of_messages")
    return call.region or "", req.SerializeToString(deterministic=True)


def receive_limits(call: Call, clock: Callable[[], float]) -> tuple[int, float | None, bool]:
    """A receive's count, how long it may wait for a free slot (its long poll: the queue's,
    at most SQS's longest, if it gives none; None for a short poll, which waits only behind
    other short polls), and whether it asked for a long poll."""
    req = call.request
    wait = req.wait_time_seconds if req.HasField("wait_time_seconds") else None
    deadline = None if wait == 0 else clock() + (MAX_WAIT_S if wait is None else wait)
    return _wanted(req), deadline, bool(wait)


def lane_of(lanes: dict[tuple[str, tuple[str, bytes]], Lane], queue: str, call: Call
             ) -> Lane:
    """The lane of ``call``'s queue and options, made if there is none."""
    key = (queue, _options(call))
    lane = lanes.get(key)
    if lane is None:
        lane = lanes[key] = Lane(queue, key)
    return lane


def take_batch(pending: list[Any]) -> tuple[list[Any], int]:
    """The next batch from the front of ``pending``: at most 10 messages asked in all."""
    batch, total = [], 0
    while pending and total + pending[0].want <= MAX_MESSAGES:
        total += pending[0].want
        batch.append(pending.pop(0))
    return batch, total


def merged_call(batch: list[Any], total: int) -> Call:
    """The call a batch makes: its one caller's own, or one asking for all of them."""
    first = batch[0].call
    return first if len(batch) == 1 else call_with(first, count=total)


def call_with(call: Call, *, count: int | None = None, wait_s: int | None = None) -> Call:
    req = pb.ReceiveMessageRequest()
    req.CopyFrom(call.request)
    if count is not None:
        req.max_number_of_messages = count
    if wait_s is not None:
        req.wait_time_seconds = wait_s
    return Call(call.method, req, call.parse, retry=call.retry, min_timeout=call.min_timeout,
                region=call.region)


def long_poll_left(r: _Receiver | _Caller, now: float) -> int | None:
    """Whole seconds a receive's own long poll has left, if it asked for one."""
    if not r.long_poll or r.deadline is None:
        return None
    left = math.floor(r.deadline - now)
    return left if left >= 1 else None


def deal(messages: list[Message], wants: list[int]) -> list[list[Message]]:
    """The messages dealt in turn, one at a time, to callers that want more."""
    shares: list[list[Message]] = [[] for _ in wants]
    it = iter(messages)
    while True:
        dealt = False
        for share, want in zip(shares, wants, strict=True):
            if len(share) < want:
                m = next(it, None)
                if m is None:
                    return shares
                share.append(m)
                dealt = True
        if not dealt:
            return shares


class ReceiveCoalescer:
    """``await call(queue, call)`` on the client's loop: a ReceiveMessage call, coalesced
    with the receives of the same options that wait with it (see the module doc)."""

    def __init__(self, run: Callable[[Call], Awaitable[Any]], release: Release,
                 max_in_flight: int = 2, clock: Callable[[], float] = time.monotonic) -> None:
        self._run = run
        self._release = release
        self._limit = max_in_flight
        self._clock = clock
        self._lanes: dict[tuple[str, tuple[str, bytes]], Lane] = {}
        self._tasks: set[asyncio.Task] = set()
        self.calls = 0  # ReceiveMessage calls made for coalesced receives (tests)

    async def call(self, queue: str, call: Call) -> list[Message]:
        if not coalescible(queue, call):
            return await self._run(call)
        me = _Receiver(call, *receive_limits(call, self._clock),
                       asyncio.get_running_loop().create_future())
        self._enqueue(queue, me)
        try:
            return await me.future
        except asyncio.CancelledError:
            self._forget(me)
            raise

    def _enqueue(self, queue: str, r: _Receiver) -> None:
        r.lane = lane = lane_of(self._lanes, queue, r.call)
        lane.pending.append(r)
        self._schedule(lane)
        if not lane.launching:
            self._arm(r)  # every slot is busy

    def _schedule(self, lane: Lane) -> None:
        if not lane.launching and lane.in_flight < self._limit:
            # At the end of this turn, after the tasks already woken in it: those that
            # receive too join this call.
            lane.launching = True
            asyncio.get_running_loop().call_soon(self._launch, lane)

    def _launch(self, lane: Lane) -> None:
        lane.launching = False
        while lane.pending and lane.in_flight < self._limit:
            batch, total = take_batch(lane.pending)
            for r in batch:
                if r.timer is not None:
                    r.timer.cancel()
            lane.in_flight += 1
            task = asyncio.ensure_future(self._send(lane, batch, total))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        for r in lane.pending:
            self._arm(r)
        self._tidy(lane)

    def _arm(self, r: _Receiver) -> None:
        """A receive waiting for a free slot waits no longer than its long poll."""
        if r.timer is None and r.deadline is not None:
            r.timer = asyncio.get_running_loop().call_later(
                max(0.0, r.deadline - self._clock()), self._expire, r)

    def _expire(self, r: _Receiver) -> None:
        r.timer = None
        self._forget(r)
        if not r.future.done():
            r.future.set_result([])  # its long poll ended before a call could carry it

    def _forget(self, r: _Receiver) -> None:
        lane = r.lane
        if lane is not None and r in lane.pending:
            lane.pending.remove(r)
            if r.timer is not None:
                r.timer.cancel()
            self._tidy(lane)

    def _tidy(self, lane: Lane) -> None:
        if not lane.pending and not lane.in_flight and not lane.launching \
                and self._lanes.get(lane.key) is lane:
            del self._lanes[lane.key]

    async def _send(self, lane: Lane, batch: list[_Receiver], total: int) -> None:
        try:
            await self._call(lane.queue, batch, total)
        finally:
            lane.in_flight -= 1
            if lane.pending:
                self._schedule(lane)
            else:
                self._tidy(lane)

    async def _call(self, queue: str, batch: list[_Receiver], total: int) -> None:
        call = merged_call(batch, total)
        self.calls += 1
        try:
            messages: list[Message] = await self._run(call)
        except BaseException as err:  # its callers get it (cancelled: the loop ends)
            for r, (_, error) in zip(batch, fail_all(batch, err), strict=True):
                if r.future.done():
                    continue
                if isinstance(error, asyncio.CancelledError):
                    r.future.cancel()
                else:
                    r.future.set_exception(error)  # type: ignore[arg-type]
            return
        shares = deal(messages, [r.want for r in batch])
        unclaimed = messages[sum(len(share) for share in shares):]  # more than asked: none
        for r, share in zip(batch, shares, strict=True):
            if r.future.done():  # its caller was cancelled: the messages go back
                unclaimed += share
            elif share:
                r.future.set_result(share)
            elif messages and (left := long_poll_left(r, self._clock())) is not None:
                r.call = call_with(r.call, wait_s=left)  # the queue ran short: try again
                self._enqueue(queue, r)
            else:
                r.future.set_result([])
        if unclaimed:
            await self._release(queue, unclaimed)

    async def wait_idle(self) -> None:
        """Wait for the coalesced calls under way (before the channels close)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
