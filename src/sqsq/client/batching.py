"""Automatic batching of the single-message calls: ``send_message``, ``delete_message`` and
``change_message_visibility`` (as the AWS SDK for Java's ``SqsAsyncBatchManager`` does).

Coalescing is by backpressure, with no timer: a call that finds a free slot (fewer than
``max_in_flight`` calls of its action in flight to its queue) goes out at once (the blocking
``Client``: from its own thread) or at the end of the event loop's current turn with the
calls made in that turn (``AsyncClient``), as the single-message RPC it would be without
batching if it is alone. A call that finds every slot busy waits; the next slot to free takes
the waiting calls, in call order, as one batch call of at most ``max_entries`` entries and
``max_bytes`` of payload. So a lone call waits for nothing, and batches grow with load.
Each caller gets its own result or its own error: a failed batch entry is that caller's
``QueueError`` with the entry's SQS code; a failed batch call fails every caller in it.

Order: entries go in call order, and a FIFO queue's sends keep one call in flight, so each
message group keeps the order of its calls. Idempotency: a batch send carries one request id
for all its attempts, and the server answers a retried entry with the first result, as for a
single send. A call that cannot legally share a batch (a message bigger than ``max_bytes``)
goes alone, as the single RPC, and gets the same error a single call gets. Two calls with
one receipt handle may share a batch: the server takes the entries in order, as it would
take the two calls. The batch calls themselves, and their answers split back to each
caller: ``sqsq.client.batchcalls``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqsq.client._call import Call
from sqsq.client.batchcalls import (
    SQS_MAX_BATCH_BYTES,
    SQS_MAX_ENTRIES,
    Outcome,
    batch_call,
    fail_all,
    payload_bytes,
    settle,
)


@dataclass(frozen=True)
class BatchSettings:
    """How the single-message calls are coalesced (``Client(..., batching=BatchSettings())``).

    ``max_entries``: entries per batch call (1-10). ``max_bytes``: payload per batch call
    (message bodies and attributes, as SQS counts them); a bigger message goes alone.
    ``max_in_flight``: calls of one action to one queue in flight before later calls wait to
    be batched (a FIFO queue's sends always use 1, to keep each group's order).
    ``receives``: concurrent receives are coalesced as well, with the same ``max_in_flight``
    (``sqsq.client.receive_batching``).
    """

    max_entries: int = SQS_MAX_ENTRIES
    max_bytes: int = SQS_MAX_BATCH_BYTES
    # 2: 16 tasks sending in a loop go out as calls of 10 and 6 (1 leaves no overlap of one
    # batch's round trip with the next; 3 and 4 measured no better); a call costs CPU.
    max_in_flight: int = 2
    receives: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.max_entries <= SQS_MAX_ENTRIES:
            raise ValueError(f"max_entries must be between 1 and {SQS_MAX_ENTRIES}")
        if not 1 <= self.max_bytes <= SQS_MAX_BATCH_BYTES:
            raise ValueError(f"max_bytes must be between 1 and {SQS_MAX_BATCH_BYTES}")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")


def resolve(batching: BatchSettings | bool | None) -> BatchSettings | None:
    """A client's ``batching`` argument: True (the defaults), a ``BatchSettings``, or
    False / None (off: every call is its own RPC)."""
    if batching is True:
        return BatchSettings()
    if batching is False or batching is None:
        return None
    if isinstance(batching, BatchSettings):
        return batching
    raise TypeError(f"batching must be a BatchSettings, True, False or None, not {batching!r}")


# -- who sends what, when ------------------------------------------------------------------


class _Waiter:
    """One caller's call while it waits to be sent."""

    __slots__ = ("call", "size", "batch", "value", "error", "done", "future")

    def __init__(self, call: Call, size: int) -> None:
        self.call = call
        self.size = size
        self.batch: list[_Waiter] | None = None  # (sync) set when this caller must send it
        self.value: Any = None
        self.error: BaseException | None = None
        self.done: threading.Event | None = None
        self.future: asyncio.Future | None = None


class _Lane:
    """The calls of one action to one queue: those waiting, and how many are in flight."""

    __slots__ = ("pending", "in_flight", "limit", "launching")

    def __init__(self, limit: int) -> None:
        self.pending: deque[_Waiter] = deque()
        self.in_flight = 0
        self.limit = limit
        self.launching = False  # (asyncio) a launch is scheduled for the end of this turn

    @property
    def idle(self) -> bool:
        return not self.in_flight and not self.pending and not self.launching

    def start(self, settings: BatchSettings) -> list[list[_Waiter]]:
        """Take the batches that may go now: waiting calls, in order, while a slot is free."""
        started = []
        while self.pending and self.in_flight < self.limit:
            started.append(self._take(settings))
            self.in_flight += 1
        return started

    def _take(self, settings: BatchSettings) -> list[_Waiter]:
        first = self.pending.popleft()
        batch = [first]
        if first.size > settings.max_bytes:
            return batch  # alone: the single RPC answers it as it answers any such message
        size = first.size
        while self.pending and len(batch) < settings.max_entries:
            nxt = self.pending[0]
            if size + nxt.size > settings.max_bytes:
                break
            batch.append(self.pending.popleft())
            size += nxt.size
        return batch


def _lane_key(queue: str, call: Call) -> tuple[str, str, str]:
    return call.method, queue, call.region or ""  # a queue name means one queue per region


def _limit(settings: BatchSettings, queue: str, call: Call) -> int:
    # Two sends in flight to a FIFO queue could overtake each other within a group.
    if call.method == "SendMessage" and queue.endswith(".fifo"):
        return 1
    return settings.max_in_flight


class Batcher:
    """Batching for the blocking ``Client``: ``call(queue, call)`` from any thread.

    The thread whose call finds a free slot sends it; a waiting call is sent by the thread of
    the first caller in its batch, woken when a slot frees (so no thread works for others
    beyond the one RPC that also carries its own entry)."""

    def __init__(self, run: Callable[[Call], Any], settings: BatchSettings) -> None:
        self._run = run
        self.settings = settings
        self._lock = threading.Lock()
        self._lanes: dict[tuple[str, str, str], _Lane] = {}

    def waiting(self) -> int:
        """How many calls wait for a slot (all queues)."""
        with self._lock:
            return sum(len(lane.pending) for lane in self._lanes.values())

    def call(self, queue: str, call: Call) -> Any:
        """Make ``call`` (a single-message call), alone or in a batch; its own result."""
        me = _Waiter(call, payload_bytes(call))
        me.done = threading.Event()
        key = _lane_key(queue, call)
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = _Lane(_limit(self.settings, queue, call))
            lane.pending.append(me)
            started = lane.start(self.settings)
        _lead(started)
        me.done.wait()
        if me.batch is not None:
            self._send(key, lane, me.batch)
        if me.error is not None:
            raise me.error
        return me.value

    def _send(self, key: tuple[str, str, str], lane: _Lane, batch: list[_Waiter]) -> None:
        try:
            if len(batch) == 1:
                outcomes: list[Outcome] = [(self._run(batch[0].call), None)]
            else:
                outcomes = settle(batch[0].call.method, len(batch),
                                  self._run(batch_call([w.call for w in batch])))
        except BaseException as err:  # every caller gets it, the sender too
            outcomes = fail_all(batch, err)
        for w, (value, error) in zip(batch, outcomes, strict=True):
            w.value, w.error = value, error
            if w is not batch[0]:
                assert w.done is not None
                w.done.set()
        with self._lock:
            lane.in_flight -= 1
            started = lane.start(self.settings)
            if lane.idle:
                del self._lanes[key]
        _lead(started)


def _lead(started: list[list[_Waiter]]) -> None:
    """Wake each new batch's first caller to send it."""
    for batch in started:
        batch[0].batch = batch
        assert batch[0].done is not None
        batch[0].done.set()


class AsyncBatcher:
    """Batching for ``AsyncClient``: ``await call(queue, call)`` on the client's loop.

    A call that finds a free slot is sent at the end of the event loop's current turn, with
    the calls of its action to its queue made in that turn: typically the callers that one
    reply has just woken (a receive's worth of consumers deleting what they got). Sent at
    once, each would take a slot of its own and the rest would wait for the next: more calls,
    and on a multiplexed stream more frames, each of which costs more than a call in it. So
    a lone call goes out with no timer and no wait for any other call; calls made together
    go out together. A call that turns out to be alone is sent by its caller, as the single
    RPC; batches are sent by tasks of their own, so a caller that is cancelled while it
    waits leaves the others' batch alone (and its own entry, if not sent yet, is
    dropped)."""

    def __init__(self, run: Callable[[Call], Awaitable[Any]], settings: BatchSettings) -> None:
        self._run = run
        self.settings = settings
        self._lanes: dict[tuple[str, str, str], _Lane] = {}
        self._tasks: set[asyncio.Task] = set()

    def waiting(self) -> int:
        """How many calls wait for a slot (all queues)."""
        return sum(len(lane.pending) for lane in self._lanes.values())

    async def call(self, queue: str, call: Call) -> Any:
        """Make ``call`` (a single-message call), alone or in a batch; its own result."""
        me = _Waiter(call, payload_bytes(call))
        loop = asyncio.get_running_loop()
        me.future = loop.create_future()
        key = _lane_key(queue, call)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(_limit(self.settings, queue, call))
        lane.pending.append(me)
        if not lane.launching and lane.in_flight < lane.limit:
            return await self._launch(key, lane, me)
        return await self._answer_of(key, lane, me)

    async def _answer_of(self, key: tuple[str, str, str], lane: _Lane, me: _Waiter) -> Any:
        """``me``'s own result, once a batch call has carried it; cancelled before it went
        out, its entry is dropped."""
        try:
            return await me.future  # type: ignore[misc]
        except asyncio.CancelledError:
            if me in lane.pending:
                lane.pending.remove(me)
                self._tidy(key, lane)
            raise

    async def _launch(self, key: tuple[str, str, str], lane: _Lane, me: _Waiter) -> Any:
        """``me`` found a free slot: it sends what this turn's calls make, at the end of the
        turn. Alone, it sends its own call itself, as the single RPC, and its answer reaches
        it with no hand-off (a lone send's reply used to wake a batch task that woke the
        caller: a turn of the loop and a task more, 30 us of a client's CPU per call); with
        company, each batch goes in a task of its own, as a batch that waits for a slot does,
        and this caller waits for its own entry's answer like the others."""
        lane.launching = True
        try:
            await asyncio.sleep(0)  # the end of this turn: the calls made in it are in
        except asyncio.CancelledError:
            lane.launching = False
            lane.pending.remove(me)
            self._spawn(key, lane, lane.start(self.settings))  # the others' calls still go
            self._tidy(key, lane)
            raise
        lane.launching = False
        started = lane.start(self.settings)
        if started[0] == [me]:
            self._spawn(key, lane, started[1:])
            try:
                return await self._run(me.call)
            finally:
                self._release(key, lane)
        self._spawn(key, lane, started)
        return await self._answer_of(key, lane, me)

    def _track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _spawn(self, key: tuple[str, str, str], lane: _Lane, started: list[list[_Waiter]]) -> None:
        if not started:
            return
        loop = asyncio.get_running_loop()
        for batch in started:
            self._track(loop.create_task(self._send(key, lane, batch)))

    def _release(self, key: tuple[str, str, str], lane: _Lane) -> None:
        lane.in_flight -= 1
        if not lane.launching:  # (else the task launched this turn takes what waits)
            self._spawn(key, lane, lane.start(self.settings))
        self._tidy(key, lane)

    def _tidy(self, key: tuple[str, str, str], lane: _Lane) -> None:
        if lane.idle and self._lanes.get(key) is lane:
            del self._lanes[key]

    async def _send(self, key: tuple[str, str, str], lane: _Lane,
                    batch: list[_Waiter]) -> None:
        """Send ``batch`` and answer its callers."""
        try:
            try:
                if len(batch) == 1:
                    outcomes: list[Outcome] = [(await self._run(batch[0].call), None)]
                else:
                    outcomes = settle(batch[0].call.method, len(batch), await self._run(
                        batch_call([w.call for w in batch])))
            except BaseException as err:  # its callers get it (cancelled: the loop ends)
                outcomes = fail_all(batch, err)
            _answer(batch, outcomes)
            # The slot frees only after the callers just answered have run: one that calls
            # again at once (a loop of sends) joins the calls waiting for this slot, rather
            # than finding it free and going out alone while they wait for the next one.
            await asyncio.sleep(0)
        finally:
            self._release(key, lane)

    async def wait_idle(self) -> None:
        """Wait for the batch calls under way (before the channels close); a lone call,
        sent by its caller, is the caller's to wait for, as an unbatched call is."""
        while self._tasks or any(lane.launching for lane in self._lanes.values()):
            if not self._tasks:
                await asyncio.sleep(0)  # a launch at the end of this turn starts them
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _answer(batch: list[_Waiter], outcomes: list[Outcome]) -> None:
    """Each waiting caller's outcome to its future (a caller cancelled meanwhile gets none)."""
    for w, (value, error) in zip(batch, outcomes, strict=True):
        fut = w.future
        assert fut is not None
        if fut.done():  # its caller was cancelled
            continue
        if isinstance(error, asyncio.CancelledError):
            fut.cancel()
        elif error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)
