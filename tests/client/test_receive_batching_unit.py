"""The SDK's receive coalescing against a fake queue that records every ReceiveMessage: which
receives share a call, what each caller gets, and what happens to the messages of a caller
that is gone. (Against a real server: test_batching.py.)"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sqsq.client import _ops
from sqsq.client._call import Call
from sqsq.client.receive_batching import ReceiveCoalescer, deal
from sqsq.client.receive_batching_sync import ThreadReceiveCoalescer
from sqsq.client.types import Message
from sqsq.errors import OverLimit, ServiceUnavailable
from sqsq.v1 import queues_pb2 as pb

Q = "http://127.0.0.1/000000000000/jobs"


class FakeQueue:
    """Hands out ``visible`` messages in order (or call by call, what ``script`` says); each
    call may be held until ``gate`` opens."""

    def __init__(self, visible: int, *, hold: bool = False, error: Exception | None = None,
                 script: list[list[str]] | None = None) -> None:
        self.visible = [f"m{i}" for i in range(visible)]
        self.script = script
        self.calls: list[Call] = []
        self.gate = asyncio.Event()
        if not hold:
            self.gate.set()
        self.error = error
        self.released: list[str] = []

    async def run(self, call: Call) -> Any:
        self.calls.append(call)
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        n = call.request.max_number_of_messages or 1
        if self.script is not None:
            taken = self.script.pop(0)
        else:
            taken, self.visible = self.visible[:n], self.visible[n:]
        return call.parse(pb.ReceiveMessageResponse(messages=[
            pb.Message(message_id=b, receipt_handle=f"rh-{b}", body=b) for b in taken]))

    async def release(self, queue: str, messages: list[Message]) -> None:
        self.released += [m.body for m in messages]


def _receive(n: int = 1, wait: int | None = 0, queue: str = Q, **kw: Any) -> Call:
    return _ops.receive_message(queue, n, visibility_timeout=30, wait_time_seconds=wait, **kw)


async def _until(cond: Any) -> None:
    """Let the loop turn until ``cond()`` holds (a few turns: no timer is involved)."""
    for _ in range(20):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("not within 20 turns of the loop")


def _bodies(results: list[list[Message]]) -> list[list[str]]:
    return [[m.body for m in r] for r in results]


def test_receives_of_one_turn_share_a_call_and_each_gets_its_own_messages() -> None:
    async def main() -> None:
        fake = FakeQueue(20)
        co = ReceiveCoalescer(fake.run, fake.release)
        results = await asyncio.gather(
            co.call(Q, _receive(1)), co.call(Q, _receive(3)), co.call(Q, _receive(1)),
            co.call(Q, _receive(2)))
        assert len(fake.calls) == 1
        assert fake.calls[0].request.max_number_of_messages == 7
        assert fake.calls[0].request.visibility_timeout == 30  # the callers' options, kept
        # dealt in turn: one each, then more to those that asked for more
        assert _bodies(results) == [["m0"], ["m1", "m4", "m6"], ["m2"], ["m3", "m5"]]

    asyncio.run(main())


def test_a_lone_receive_is_sent_before_the_caller_first_waits_for_it() -> None:
    async def main() -> None:
        fake = FakeQueue(5, hold=True)
        co = ReceiveCoalescer(fake.run, fake.release)
        task = asyncio.ensure_future(co.call(Q, _receive(1, wait=20)))
        for _ in range(3):  # the caller runs; at the end of its turn the call is started
            await asyncio.sleep(0)
        assert len(fake.calls) == 1  # out, though nothing else came and no timer ran
        assert fake.calls[0].request == _receive(1, wait=20).request  # its own, unchanged
        fake.gate.set()
        assert _bodies([await task]) == [["m0"]]

    asyncio.run(main())


def test_more_than_ten_wanted_splits_into_calls_and_busy_slots_make_callers_wait() -> None:
    async def main() -> None:
        fake = FakeQueue(100, hold=True)
        co = ReceiveCoalescer(fake.run, fake.release, max_in_flight=2)
        tasks = [asyncio.ensure_future(co.call(Q, _receive(1))) for _ in range(25)]
        await _until(lambda: len(fake.calls) == 2)
        assert [c.request.max_number_of_messages for c in fake.calls] == [10, 10]
        fake.gate.set()
        results = await asyncio.gather(*tasks)
        assert [c.request.max_number_of_messages for c in fake.calls] == [10, 10, 5]
        bodies = [b for r in _bodies(results) for b in r]
        assert sorted(bodies) == sorted(f"m{i}" for i in range(25))  # nothing twice

    asyncio.run(main())


def test_different_options_fifo_queues_and_attempt_ids_do_not_share_a_call() -> None:
    async def main() -> None:
        fake = FakeQueue(20)
        co = ReceiveCoalescer(fake.run, fake.release)
        fifo = Q + ".fifo"
        await asyncio.gather(
            co.call(Q, _receive(1)), co.call(Q, _receive(1, wait=5)),
            co.call(fifo, _receive(1, queue=fifo)), co.call(fifo, _receive(1, queue=fifo)),
            co.call(Q, _receive(1, receive_request_attempt_id="a1")),
            co.call(Q, _receive(1, receive_request_attempt_id="a2")))
        assert sorted(c.request.max_number_of_messages for c in fake.calls) == [1] * 6

    asyncio.run(main())


def test_a_failed_call_fails_each_of_its_callers_with_an_error_of_its_own() -> None:
    async def main() -> None:
        fake = FakeQueue(5, error=ServiceUnavailable("down"))
        co = ReceiveCoalescer(fake.run, fake.release)
        results = await asyncio.gather(*(co.call(Q, _receive(1)) for _ in range(4)),
                                       return_exceptions=True)
        assert len(fake.calls) == 1
        assert all(isinstance(e, ServiceUnavailable) and e.code == "ServiceUnavailable"
                   for e in results)
        assert len({id(e) for e in results}) == 4

    asyncio.run(main())


def test_an_invalid_count_goes_alone_and_gets_the_servers_error() -> None:
    async def main() -> None:
        fake = FakeQueue(5)

        async def run(call: Call) -> Any:
            if not 1 <= call.request.max_number_of_messages <= 10:
                raise OverLimit("bad count")
            return await fake.run(call)

        co = ReceiveCoalescer(run, fake.release)
        results = await asyncio.gather(co.call(Q, _receive(0)), co.call(Q, _receive(11)),
                                       co.call(Q, _receive(1)), return_exceptions=True)
        assert isinstance(results[0], OverLimit) and isinstance(results[1], OverLimit)
        assert _bodies([results[2]]) == [["m0"]]

    asyncio.run(main())


def test_a_caller_left_out_when_the_queue_ran_short_polls_again_with_the_time_it_has_left(
        ) -> None:
    async def main() -> None:
        now = [100.0]
        fake = FakeQueue(0, hold=True, script=[["m0"], [], ["late"]])
        co = ReceiveCoalescer(fake.run, fake.release, clock=lambda: now[0])
        first = asyncio.ensure_future(co.call(Q, _receive(1, wait=10)))
        second = asyncio.ensure_future(co.call(Q, _receive(1, wait=10)))
        short = asyncio.ensure_future(co.call(Q, _receive(1, wait=0)))
        await _until(lambda: len(fake.calls) == 2)
        now[0] += 3.5  # the long poll took this long before a message came
        fake.gate.set()
        assert _bodies(await asyncio.gather(first, second, short)) == [["m0"], ["late"], []]
        # the second joined a call of its own with the time it had left; the short poll
        # that found nothing got nothing, at once
        assert [(c.request.max_number_of_messages, c.request.wait_time_seconds)
                for c in fake.calls] == [(2, 10), (1, 0), (1, 6)]

    asyncio.run(main())


def test_a_caller_cancelled_while_its_call_is_out_has_its_messages_made_visible() -> None:
    async def main() -> None:
        fake = FakeQueue(5, hold=True)
        co = ReceiveCoalescer(fake.run, fake.release)
        keep = asyncio.ensure_future(co.call(Q, _receive(1)))
        gone = asyncio.ensure_future(co.call(Q, _receive(2)))
        await _until(lambda: fake.calls)
        assert fake.calls[0].request.max_number_of_messages == 3
        gone.cancel()
        fake.gate.set()
        assert _bodies([await keep]) == [["m0"]]
        await co.wait_idle()
        assert gone.cancelled()
        assert fake.released == ["m1", "m2"]

    asyncio.run(main())


def test_a_caller_waiting_for_a_slot_gets_nothing_once_its_long_poll_ends() -> None:
    """Two long polls in flight (held: an empty queue); a third receive waits for a slot and
    is answered, empty, when its own wait time is over, while the others still wait."""
    async def main() -> None:
        fake = FakeQueue(0, hold=True)
        co = ReceiveCoalescer(fake.run, fake.release, max_in_flight=2)
        loop = asyncio.get_running_loop()
        busy = [asyncio.ensure_future(co.call(Q, _receive(9, wait=1))) for _ in range(2)]
        await _until(lambda: len(fake.calls) == 2)
        started = loop.time()
        late = await co.call(Q, _receive(1, wait=1))
        assert late == [] and loop.time() - started >= 0.9
        assert len(fake.calls) == 2 and not any(t.done() for t in busy)
        fake.gate.set()
        assert _bodies(await asyncio.gather(*busy)) == [[], []]

    asyncio.run(main())


@given(st.lists(st.integers(1, 9), min_size=1, max_size=10), st.integers(0, 12))
def test_dealing_gives_each_at_most_what_it_asked_and_loses_nothing(
        wants: list[int], available: int) -> None:
    messages = [Message(f"m{i}", f"rh{i}", f"m{i}", "md5") for i in range(available)]
    shares = deal(messages, wants)
    dealt = [m for share in shares for m in share]
    assert all(len(share) <= want for share, want in zip(shares, wants, strict=True))
    assert len(dealt) == min(available, sum(wants))
    assert sorted(m.message_id for m in dealt) == sorted(
        m.message_id for m in messages[:len(dealt)])  # the first ones, each once
    # in turn: nobody gets a second before everyone who wants one has a first
    firsts = sum(1 for share in shares if share)
    assert firsts == min(len(wants), len(dealt))


# -- threads (the blocking Client) ---------------------------------------------------------


class ThreadQueue:
    """``FakeQueue`` for threads: hands out ``visible`` in order; while ``hold`` is clear,
    every call waits for it."""

    def __init__(self, visible: int, error: Any = None) -> None:
        self.visible = [f"m{i}" for i in range(visible)]
        self.calls: list[tuple[Call, str]] = []  # and the thread that made it
        self.hold = threading.Event()
        self.hold.set()
        self.error = error
        self._lock = threading.Lock()

    def run(self, call: Call) -> Any:
        with self._lock:
            self.calls.append((call, threading.current_thread().name))
        assert self.hold.wait(30)
        if self.error is not None:
            raise self.error()  # a new one per call, as a real transport raises
        with self._lock:
            n = call.request.max_number_of_messages or 1
            taken, self.visible = self.visible[:n], self.visible[n:]
        return call.parse(pb.ReceiveMessageResponse(messages=[
            pb.Message(message_id=b, receipt_handle=f"rh-{b}", body=b) for b in taken]))


def _wait_until(cond: Any) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, "not within 10 s"
        time.sleep(0.001)


def test_threads_a_lone_receive_is_sent_by_its_own_thread_at_once() -> None:
    fake = ThreadQueue(3)
    co = ThreadReceiveCoalescer(fake.run)
    got = co.call(Q, _receive(1, wait=20))
    assert [m.body for m in got] == ["m0"]
    assert [(c.request, who) for c, who in fake.calls] == [
        (_receive(1, wait=20).request, threading.current_thread().name)]


def test_threads_waiting_for_a_slot_share_a_call_and_each_gets_its_own() -> None:
    fake = ThreadQueue(40)
    fake.hold.clear()
    co = ThreadReceiveCoalescer(fake.run, max_in_flight=1)
    with ThreadPoolExecutor(12) as pool:
        first = pool.submit(co.call, Q, _receive(1))
        _wait_until(lambda: len(fake.calls) == 1)  # the slot is taken
        rest = [pool.submit(co.call, Q, _receive(1)) for _ in range(11)]
        _wait_until(lambda: co.waiting() == 11)
        fake.hold.set()
        results = [first.result(10)] + [f.result(10) for f in rest]
    assert [c.request.max_number_of_messages for c, _ in fake.calls] == [1, 10, 1]
    bodies = [m.body for r in results for m in r]
    assert all(len(r) == 1 for r in results)
    assert sorted(bodies) == sorted(f"m{i}" for i in range(12))  # each once


def test_threads_a_failed_call_fails_each_caller_with_its_own_error() -> None:
    fake = ThreadQueue(5, error=lambda: ServiceUnavailable("down"))
    fake.hold.clear()
    co = ThreadReceiveCoalescer(fake.run, max_in_flight=1)
    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(co.call, Q, _receive(1))]
        _wait_until(lambda: len(fake.calls) == 1)
        futures += [pool.submit(co.call, Q, _receive(1)) for _ in range(4)]
        _wait_until(lambda: co.waiting() == 4)
        fake.hold.set()
        errors = [f.exception(10) for f in futures]
    assert all(isinstance(e, ServiceUnavailable) for e in errors)
    assert len({id(e) for e in errors}) == 5
    assert len(fake.calls) == 2


def test_threads_a_receive_waiting_for_a_slot_gets_nothing_once_its_long_poll_ends() -> None:
    fake = ThreadQueue(0)
    fake.hold.clear()
    co = ThreadReceiveCoalescer(fake.run, max_in_flight=1)
    with ThreadPoolExecutor(2) as pool:
        busy = pool.submit(co.call, Q, _receive(1, wait=1))
        _wait_until(lambda: len(fake.calls) == 1)
        started = time.monotonic()
        assert co.call(Q, _receive(1, wait=1)) == []
        assert time.monotonic() - started >= 0.9
        assert len(fake.calls) == 1 and not busy.done()  # it never went out
        assert co.waiting() == 0
        fake.hold.set()
        assert busy.result(10) == []
