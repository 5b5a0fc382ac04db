"""The SDK's batcher against a fake transport that records every RPC: when calls go out,
what they carry, and what each caller gets back. (The same behaviour against a real server
is in test_batching.py.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from sqsq.client import BatchSettings, SendResult, _ops
from sqsq.client._call import Call
from sqsq.client.batching import AsyncBatcher, Batcher
from sqsq.errors import QueueError, ReceiptHandleIsInvalid, ServiceUnavailable
from sqsq.v1 import queues_pb2 as pb

Q = "http://127.0.0.1/000000000000/jobs"


def _reply(call: Call) -> Any:
    """What a healthy server answers, parsed as the real transport parses it."""
    req = call.request
    if call.method == "SendMessage":
        return call.parse(pb.SendMessageResponse(message_id=f"id-{req.message_body}",
                                                 md5_of_message_body="md5"))
    if call.method == "SendMessageBatch":
        return call.parse(pb.SendMessageBatchResponse(successful=[
            pb.SendMessageBatchResultEntry(id=e.id, message_id=f"id-{e.message_body}",
                                           md5_of_message_body="md5")
            for e in req.entries]))
    if call.method in ("DeleteMessageBatch", "ChangeMessageVisibilityBatch"):
        ok = [e.id for e in req.entries if e.receipt_handle != "bad"]
        failed = [pb.BatchResultErrorEntry(id=e.id, code="ReceiptHandleIsInvalid",
                                           message=f"bad handle {e.id}", sender_fault=True)
                  for e in req.entries if e.receipt_handle == "bad"]
        return call.parse(pb.BatchResponse(successful=ok, failed=failed))
    return call.parse(pb.Empty())


def _bodies(call: Call) -> list[str]:
    if call.method == "SendMessage":
        return [call.request.message_body]
    return [e.message_body for e in call.request.entries]


def _wait_until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.001)


# -- asyncio -------------------------------------------------------------------------------


class FakeAio:
    """Records each RPC; the first one waits until ``gate`` is set (so others pile up)."""

    def __init__(self, fail: Callable[[Call], QueueError | None] = lambda c: None) -> None:
        self.calls: list[Call] = []
        self.gate = asyncio.Event()
        self.fail = fail
        self.in_flight = 0
        self.max_in_flight = 0

    async def run(self, call: Call) -> Any:
        self.calls.append(call)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if len(self.calls) == 1:
                await self.gate.wait()
            else:
                await asyncio.sleep(0)
            err = self.fail(call)
            if err is not None:
                raise err
            return _reply(call)
        finally:
            self.in_flight -= 1


async def _until_sent(fake: FakeAio, n: int) -> None:
    """Let the loop turn (no timer, no clock) until ``n`` RPCs are out."""
    for _ in range(100):
        if len(fake.calls) >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{len(fake.calls)} RPCs out, not {n}")


def test_a_lone_call_goes_out_alone_at_the_end_of_its_turn() -> None:
    async def main() -> None:
        fake = FakeAio()
        batcher = AsyncBatcher(fake.run, BatchSettings())
        task = asyncio.ensure_future(batcher.call(Q, _ops.send_message(Q, "only")))
        for _ in range(3):  # the caller runs; at the end of its turn the call is started
            await asyncio.sleep(0)
        # out as the single-message RPC, though nothing else came and no timer ran
        assert [(c.method, _bodies(c)) for c in fake.calls] == [("SendMessage", ["only"])]
        fake.gate.set()
        assert await task == SendResult("id-only", "md5")

    asyncio.run(main())


def test_a_lone_call_is_sent_by_its_caller_and_a_cancelled_one_frees_its_slot() -> None:
    # (no batch task: its answer reaches the caller with no hand-off between tasks)
    async def main() -> None:
        fake = FakeAio()
        batcher = AsyncBatcher(fake.run, BatchSettings(max_in_flight=1))
        task = asyncio.ensure_future(batcher.call(Q, _ops.send_message(Q, "only")))
        await _until_sent(fake, 1)
        assert batcher._tasks == set()  # the caller's own task sends it
        task.cancel()  # as a deadline would: the RPC is abandoned, its slot freed
        with pytest.raises(asyncio.CancelledError):
            await task
        fake.gate.set()
        assert await batcher.call(Q, _ops.send_message(Q, "next")) == SendResult(
            "id-next", "md5")
        assert [_bodies(c) for c in fake.calls] == [["only"], ["next"]]

    asyncio.run(main())


def test_calls_made_together_go_out_together_each_caller_gets_its_own_result() -> None:
    async def main() -> None:
        fake = FakeAio()
        batcher = AsyncBatcher(fake.run, BatchSettings(max_in_flight=1))
        tasks = [asyncio.ensure_future(batcher.call(Q, _ops.send_message(Q, f"m{i}")))
                 for i in range(30)]
        await _until_sent(fake, 1)
        assert batcher.waiting() == 20  # the first ten went as one call; one slot
        fake.gate.set()
        results = await asyncio.gather(*tasks)
        assert results == [SendResult(f"id-m{i}", "md5") for i in range(30)]
        assert [c.method for c in fake.calls] == ["SendMessageBatch"] * 3
        sent = [b for c in fake.calls for b in _bodies(c)]
        assert sent == [f"m{i}" for i in range(30)]  # call order, nothing twice
        # one request id per batch call, entry ids distinct within it
        ids = [c.request.request_id for c in fake.calls]
        assert len(set(ids)) == 3 and all(ids)
        for c in fake.calls:
            assert len({e.id for e in c.request.entries}) == len(c.request.entries) == 10

    asyncio.run(main())


def test_callers_that_send_again_at_once_join_the_next_batch_not_a_call_alone() -> None:
    """16 tasks, each sending in a loop: every call carries several messages. (A slot freed
    before its answered callers had run went to the first of them to call again, alone,
    while the rest waited for the next one: calls of 1 and 10.)"""
    async def main() -> None:
        calls: list[Call] = []

        async def run(call: Call) -> Any:
            calls.append(call)
            for _ in range(3):  # a round trip: the loop turns a few times before the answer
                await asyncio.sleep(0)
            return _reply(call)

        batcher = AsyncBatcher(run, BatchSettings(max_in_flight=2))

        async def sender(i: int) -> list[SendResult]:
            return [await batcher.call(Q, _ops.send_message(Q, f"{i}-{n}")) for n in range(20)]

        results = await asyncio.gather(*[sender(i) for i in range(16)])
        assert results == [[SendResult(f"id-{i}-{n}", "md5") for n in range(20)]
                           for i in range(16)]
        sizes = [len(_bodies(c)) for c in calls]
        assert sizes[:2] == [10, 6]  # started together: ten in one slot, the rest in the other
        assert min(sizes) >= 5, sizes
        assert sum(sizes) == 16 * 20

    asyncio.run(main())


def test_one_failed_entry_fails_only_its_caller() -> None:
    async def main() -> None:
        fake = FakeAio()
        batcher = AsyncBatcher(fake.run, BatchSettings(max_in_flight=1))
        handles = ["h0", "h1", "h2", "bad", "h4"]
        tasks = [asyncio.ensure_future(batcher.call(Q, _ops.delete_message(Q, h)))
                 for h in handles]
        await _until_sent(fake, 1)
        fake.gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert [c.method for c in fake.calls] == ["DeleteMessageBatch"]
        assert results[:3] == [None, None, None] and results[4] is None
        assert isinstance(results[3], ReceiptHandleIsInvalid)
        assert results[3].code == "ReceiptHandleIsInvalid"

    asyncio.run(main())


def test_a_failed_batch_call_reaches_every_caller_in_it() -> None:
    async def main() -> None:
        def fail(call: Call) -> QueueError | None:
            return ServiceUnavailable("down") if call.method.endswith("Batch") else None

        fake = FakeAio(fail)
        batcher = AsyncBatcher(fake.run, BatchSettings(max_in_flight=1))
        tasks = [asyncio.ensure_future(batcher.call(Q, _ops.change_message_visibility(
            Q, f"h{i}", 5))) for i in range(6)]
        await _until_sent(fake, 1)
        fake.gate.set()
        errors = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(e, ServiceUnavailable) and e.message == "down" for e in errors)
        assert len({id(e) for e in errors}) == 6  # each caller its own exception
        assert [c.method for c in fake.calls] == ["ChangeMessageVisibilityBatch"]

    asyncio.run(main())


def test_a_fifo_queue_keeps_one_send_in_flight_and_call_order() -> None:
    async def main() -> None:
        fake = FakeAio()
        fifo = Q + ".fifo"
        batcher = AsyncBatcher(fake.run, BatchSettings(max_in_flight=8))
        tasks = [asyncio.ensure_future(batcher.call(fifo, _ops.send_message(
            fifo, f"m{i}", message_group_id=f"g{i % 3}"))) for i in range(25)]
        await _until_sent(fake, 1)
        fake.gate.set()
        await asyncio.gather(*tasks)
        assert fake.max_in_flight == 1
        assert [b for c in fake.calls for b in _bodies(c)] == [f"m{i}" for i in range(25)]
        assert len(fake.calls) < 25

    asyncio.run(main())


def test_a_message_too_big_to_share_goes_alone() -> None:
    async def main() -> None:
        fake = FakeAio()
        batcher = AsyncBatcher(fake.run, BatchSettings(max_in_flight=1, max_bytes=1000))
        bodies = ["a", "b", "c" * 2000, "d", "e"]
        tasks = [asyncio.ensure_future(batcher.call(Q, _ops.send_message(Q, b)))
                 for b in bodies]
        await _until_sent(fake, 1)
        fake.gate.set()
        await asyncio.gather(*tasks)
        assert [(c.method, _bodies(c)) for c in fake.calls] == [
            ("SendMessageBatch", ["a", "b"]),  # "c..." does not fit beside them
            ("SendMessage", ["c" * 2000]), ("SendMessageBatch", ["d", "e"])]

    asyncio.run(main())


# -- threads -------------------------------------------------------------------------------


def test_threads_coalesce_and_the_lone_call_is_sent_by_its_own_thread() -> None:
    gate = threading.Event()
    calls: list[tuple[Call, threading.Thread]] = []
    lock = threading.Lock()

    def run(call: Call) -> Any:
        with lock:
            calls.append((call, threading.current_thread()))
            first = len(calls) == 1
        if first:
            assert gate.wait(10)
        return _reply(call)

    batcher = Batcher(run, BatchSettings(max_in_flight=1))
    gate.set()
    assert batcher.call(Q, _ops.send_message(Q, "lone")) == SendResult("id-lone", "md5")
    assert [(c.method, t) for c, t in calls] == [("SendMessage", threading.current_thread())]

    calls.clear()
    gate.clear()
    with ThreadPoolExecutor(30) as pool:
        futures = [pool.submit(batcher.call, Q, _ops.send_message(Q, f"m{i}"))
                   for i in range(30)]
        _wait_until(lambda: batcher.waiting() == 29)
        gate.set()
        results = [f.result(timeout=10) for f in futures]
    assert results == [SendResult(f"id-m{i}", "md5") for i in range(30)]
    assert len(calls) < 30
    assert sorted(b for c, _ in calls for b in _bodies(c)) == sorted(f"m{i}" for i in range(30))


def test_threads_a_failed_batch_call_reaches_every_caller() -> None:
    gate = threading.Event()
    n = [0]

    def run(call: Call) -> Any:
        n[0] += 1
        if n[0] == 1:
            assert gate.wait(10)
            return _reply(call)
        raise ServiceUnavailable("down")

    batcher = Batcher(run, BatchSettings(max_in_flight=1))
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(batcher.call, Q, _ops.delete_message(Q, f"h{i}"))
                   for i in range(8)]
        _wait_until(lambda: batcher.waiting() == 7)
        gate.set()
        assert futures[0].result(timeout=10) is None
        for f in futures[1:]:
            with pytest.raises(ServiceUnavailable):
                f.result(timeout=10)
    assert n[0] == 2  # the lone first call, then one batch of the other seven
