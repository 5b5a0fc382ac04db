"""Receive coalescing for the blocking ``Client`` (``ThreadReceiveCoalescer``): the rules of
``sqsq.client.receive_batching`` (whose docstring gives them) with threads instead of an
event loop. A receive that finds a free slot is sent at once by its own thread; a batch that
waited for one is sent by its first caller's thread, which then hands each caller its share."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from sqsq.client._call import Call
from sqsq.client.batching import fail_all
from sqsq.client.receive_batching import (
    Lane,
    call_with,
    coalescible,
    deal,
    lane_of,
    long_poll_left,
    merged_call,
    receive_limits,
    take_batch,
)
from sqsq.client.types import Message


class _Caller:
    """One thread's receive (``ThreadReceiveCoalescer``); its fields change under the lock."""

    __slots__ = ("call", "want", "deadline", "long_poll", "lane", "event", "batch", "done",
                 "result", "error")

    def __init__(self, call: Call, want: int, deadline: float | None, long_poll: bool) -> None:
        self.call = call
        self.want = want
        self.deadline = deadline
        self.long_poll = long_poll
        self.lane: Lane | None = None
        self.event = threading.Event()  # set when it must send a batch, or is answered
        self.batch: tuple[list[_Caller], int] | None = None  # what this caller sends
        self.done = False
        self.result: list[Message] = []
        self.error: BaseException | None = None


class ThreadReceiveCoalescer:
    """``call(queue, call)`` from any thread (the blocking ``Client``): the rules of
    ``sqsq.client.receive_batching``."""

    def __init__(self, run: Callable[[Call], Any], max_in_flight: int = 2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._run = run
        self._limit = max_in_flight
        self._clock = clock
        self._lock = threading.Lock()
        self._lanes: dict[tuple[str, tuple[str, bytes]], Lane] = {}
        self.calls = 0  # ReceiveMessage calls made for coalesced receives (tests)

    def waiting(self) -> int:
        """How many receives wait for a slot (all queues)."""
        with self._lock:
            return sum(len(lane.pending) for lane in self._lanes.values())

    def call(self, queue: str, call: Call) -> list[Message]:
        if not coalescible(queue, call):
            return self._run(call)
        me = _Caller(call, *receive_limits(call, self._clock))
        with self._lock:
            self._enter(queue, me)
        expired = False
        while True:
            timeout = None if me.deadline is None or expired else \
                max(0.0, me.deadline - self._clock())
            if not me.event.wait(timeout):
                with self._lock:
                    lane = me.lane
                    if lane is not None and me in lane.pending:  # still waiting for a slot
                        lane.pending.remove(me)
                        self._tidy(lane)
                        return []
                expired = True  # taken into a batch meanwhile: its answer is coming
                continue
            with self._lock:
                me.event.clear()
                batch, me.batch = me.batch, None
            if batch is not None:
                self._send(queue, *batch)
            if me.done:
                if me.error is not None:
                    raise me.error
                return me.result

    def _enter(self, queue: str, r: _Caller) -> None:
        """(Under the lock.) Queue ``r`` and start what may go now."""
        r.lane = lane = lane_of(self._lanes, queue, r.call)
        lane.pending.append(r)
        self._start(lane)

    def _start(self, lane: Lane) -> None:
        """(Under the lock.) Hand each batch that may go now to its first caller."""
        while lane.pending and lane.in_flight < self._limit:
            batch, total = take_batch(lane.pending)
            lane.in_flight += 1
            batch[0].batch = batch, total
            batch[0].event.set()

    def _tidy(self, lane: Lane) -> None:
        if not lane.pending and not lane.in_flight and self._lanes.get(lane.key) is lane:
            del self._lanes[lane.key]

    def _send(self, queue: str, batch: list[_Caller], total: int) -> None:
        call = merged_call(batch, total)
        self.calls += 1
        messages: list[Message] = []
        errors: list[BaseException | None] = [None] * len(batch)
        try:
            messages = self._run(call)
        except BaseException as err:  # every caller gets it, the sender too
            errors = [e for _, e in fail_all(batch, err)]
        shares = deal(messages, [r.want for r in batch])
        lane = batch[0].lane
        assert lane is not None
        with self._lock:
            for r, share, error in zip(batch, shares, errors, strict=True):
                if error is None and not share and messages and \
                        (left := long_poll_left(r, self._clock())) is not None:
                    r.call = call_with(r.call, wait_s=left)  # the queue ran short: try again
                    self._enter(queue, r)
                    continue
                r.result, r.error, r.done = share, error, True
                r.event.set()
            lane.in_flight -= 1
            self._start(lane)
            self._tidy(lane)
