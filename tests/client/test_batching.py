"""Automatic batching against a real server: concurrent single-message calls share batch
calls, and each caller sees exactly what it would have seen alone.

RPCs are counted where the client makes them (``_batcher._run``), so the counts hold
whatever carries the calls to the server."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from serverproc import ServerProcess
from sqsq.client import AsyncClient, BatchSettings, Client, Message
from sqsq.client._call import Call
from sqsq.errors import InvalidParameterValue, QueueDoesNotExist, ReceiptHandleIsInvalid


def _name(prefix: str = "batch") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def _count_rpcs(client: Client | AsyncClient) -> Counter[str]:
    """Count the RPCs the client's batcher makes, by method."""
    seen: Counter[str] = Counter()
    batcher = client._batcher
    assert batcher is not None
    run = batcher._run
    if isinstance(client, AsyncClient):
        async def counted_async(call: Call) -> Any:
            seen[call.method] += 1
            return await run(call)

        batcher._run = counted_async
    else:
        def counted(call: Call) -> Any:
            seen[call.method] += 1
            return run(call)

        batcher._run = counted
    return seen


def _drain(client: Client, url: str, expected: int) -> list[Message]:
    got: list[Message] = []
    for _ in range(100):
        if len(got) >= expected:
            break
        batch = client.receive_message(url, 10, visibility_timeout=60, wait_time_seconds=1)
        got.extend(batch)
    return got


def _depth(client: Client, url: str) -> tuple[int, int]:
    a = client.get_queue_attributes(url, ["All"])
    return int(a["ApproximateNumberOfMessages"]), int(a["ApproximateNumberOfMessagesNotVisible"])


def test_concurrent_sends_coalesce_and_each_caller_gets_its_own_result(
        server: ServerProcess) -> None:
    async def main() -> tuple[str, list[Any], Counter[str]]:
        async with AsyncClient(server.endpoint) as c:
            url = await c.create_queue(_name())
            rpcs = _count_rpcs(c)
            results = await asyncio.gather(*(c.send_message(url, f"body-{i}")
                                             for i in range(30)))
            return url, results, rpcs

    url, results, rpcs = asyncio.run(main())
    assert [r.md5_of_message_body for r in results] == [_md5(f"body-{i}") for i in range(30)]
    assert sum(rpcs.values()) < 30 and rpcs["SendMessageBatch"] >= 1
    with Client(server.endpoint) as c:
        got = _drain(c, url, 30)
    assert sorted(m.body for m in got) == sorted(f"body-{i}" for i in range(30))
    assert {m.message_id for m in got} == {r.message_id for r in results}  # each its own id


def test_a_lone_call_is_one_single_message_rpc(server: ServerProcess) -> None:
    with Client(server.endpoint) as c:
        url = c.create_queue(_name())
        rpcs = _count_rpcs(c)
        sent = c.send_message(url, "alone")
        [m] = c.receive_message(url, 10, wait_time_seconds=1)
        c.change_message_visibility(url, m.receipt_handle, 30)
        c.delete_message(url, m.receipt_handle)
        assert m.message_id == sent.message_id
        assert rpcs == {"SendMessage": 1, "ChangeMessageVisibility": 1, "DeleteMessage": 1}
        assert _depth(c, url) == (0, 0)


def test_one_bad_receipt_handle_in_a_batch_fails_only_its_caller(server: ServerProcess) -> None:
    with Client(server.endpoint) as setup:
        url = setup.create_queue(_name())
        setup.send_message_batch(url, [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(9)])
        handles = [m.receipt_handle for m in _drain(setup, url, 9)]
        assert len(handles) == 9
        bad = handles[4][:-6] + ("AAAAAA" if not handles[4].endswith("AAAAAA") else "BBBBBB")
        handles.insert(5, bad)

    async def main() -> tuple[list[Any], Counter[str]]:
        # Made together: one DeleteMessageBatch, the bad handle among the ten.
        async with AsyncClient(server.endpoint, batching=BatchSettings(max_in_flight=1)) as c:
            rpcs = _count_rpcs(c)
            results = await asyncio.gather(*(c.delete_message(url, h) for h in handles),
                                           return_exceptions=True)
            return results, rpcs

    results, rpcs = asyncio.run(main())
    assert rpcs == {"DeleteMessageBatch": 1}
    assert isinstance(results[5], ReceiptHandleIsInvalid), results[5]
    assert results[:5] + results[6:] == [None] * 9
    with Client(server.endpoint) as c:
        assert _depth(c, url) == (0, 0)  # the nine good deletes really deleted


def test_fifo_order_per_group_is_kept_across_coalesced_sends(server: ServerProcess) -> None:
    groups = ["a", "b", "c"]

    async def main() -> tuple[str, list[Any], Counter[str]]:
        async with AsyncClient(server.endpoint) as c:
            url = await c.create_queue(_name("fifo") + ".fifo", attributes={
                "FifoQueue": "true", "ContentBasedDeduplication": "true"})
            rpcs = _count_rpcs(c)
            # Started in this order, all at once: with batching, the calls' order is the
            # queue's order within each group.
            results = await asyncio.gather(*(
                c.send_message(url, f"{groups[i % 3]}-{i}", message_group_id=groups[i % 3])
                for i in range(45)))
            return url, results, rpcs

    url, results, rpcs = asyncio.run(main())
    assert sum(rpcs.values()) < 45
    seqs = [int(r.sequence_number) for r in results]
    assert seqs == sorted(seqs)  # the server saw them in call order
    received: list[str] = []
    with Client(server.endpoint) as c:
        for _ in range(100):
            if len(received) >= 45:
                break
            batch = c.receive_message(url, 10, visibility_timeout=60, wait_time_seconds=1)
            received.extend(m.body for m in batch)
            c.delete_message_batch(url, [{"Id": str(i), "ReceiptHandle": m.receipt_handle}
                                         for i, m in enumerate(batch)])
    for g in groups:
        mine = [b for b in received if b.startswith(f"{g}-")]
        assert mine == [f"{g}-{i}" for i in range(45) if groups[i % 3] == g]


def test_a_failed_batch_call_reaches_every_caller(server: ServerProcess) -> None:
    async def main() -> tuple[list[Any], Counter[str]]:
        async with AsyncClient(server.endpoint, batching=BatchSettings(max_in_flight=1)) as c:
            rpcs = _count_rpcs(c)
            missing = _name("missing")  # never created
            results = await asyncio.gather(*(c.send_message(missing, f"m{i}")
                                             for i in range(8)), return_exceptions=True)
            return results, rpcs

    results, rpcs = asyncio.run(main())
    assert all(isinstance(r, QueueDoesNotExist) for r in results), results
    assert rpcs == {"SendMessageBatch": 1}  # the eight shared the failed call
    assert len({id(r) for r in results}) == len(results)


def test_an_oversize_message_among_batched_sends_gets_the_single_call_error(
        server: ServerProcess) -> None:
    with Client(server.endpoint) as c:
        url = c.create_queue(_name())
        with pytest.raises(InvalidParameterValue) as alone:
            c.send_message(url, "x" * 1_048_577)

    async def main() -> list[Any]:
        async with AsyncClient(server.endpoint, batching=BatchSettings(max_in_flight=1)) as c:
            return await asyncio.gather(
                *(c.send_message(url, f"m{i}") for i in range(3)),
                c.send_message(url, "x" * 1_048_577),
                *(c.send_message(url, f"m{i}") for i in range(3, 6)),
                return_exceptions=True)

    results = asyncio.run(main())
    assert isinstance(results[3], InvalidParameterValue)
    assert results[3].message == alone.value.message
    assert all(r.md5_of_message_body for r in results[:3] + results[4:])
    with Client(server.endpoint) as c:
        assert sorted(m.body for m in _drain(c, url, 6)) == [f"m{i}" for i in range(6)]


def test_threads_share_batches_and_get_their_own_results(server: ServerProcess) -> None:
    with Client(server.endpoint, batching=BatchSettings(max_in_flight=1)) as c:
        url = c.create_queue(_name())
        rpcs = _count_rpcs(c)
        # the first RPC waits until the other 29 callers are queued behind it
        batcher = c._batcher
        assert batcher is not None
        run = batcher._run
        first = threading.Event()

        def held_first(call: Call) -> Any:
            if not first.is_set():
                first.set()
                _until(lambda: batcher.waiting() == 29)
            return run(call)

        batcher._run = held_first
        with ThreadPoolExecutor(30) as pool:
            results = list(pool.map(lambda i: c.send_message(url, f"t{i}"), range(30)))
        assert [r.md5_of_message_body for r in results] == [_md5(f"t{i}") for i in range(30)]
        assert rpcs == {"SendMessage": 1, "SendMessageBatch": 3}
        got = _drain(c, url, 30)
        assert sorted(m.body for m in got) == sorted(f"t{i}" for i in range(30))

        # and the same for visibility changes: released messages are receivable again
        first.clear()
        with ThreadPoolExecutor(30) as pool:
            list(pool.map(lambda m: c.change_message_visibility(url, m.receipt_handle, 0),
                          got))
        again = _drain(c, url, 30)
        assert sorted(m.body for m in again) == sorted(f"t{i}" for i in range(30))


def _until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.001)


def test_a_retried_batch_send_is_not_applied_twice(server: ServerProcess) -> None:
    """What the client's retry on UNAVAILABLE does with a batch the SDK made: the same call,
    same request id, again. The server answers it with the first result."""
    from sqsq.client import _ops
    from sqsq.client.batchcalls import _send_batch

    with Client(server.endpoint) as c:
        url = c.create_queue(_name())
        singles = [_ops.send_message(url, f"r{i}").request for i in range(5)]
        call = _send_batch(url, singles)
        first = c._run(call)
        again = c._run(call)
        assert [e.message_id for e in again.successful] == \
            [e.message_id for e in first.successful]
        assert _depth(c, url) == (5, 0)


def test_concurrent_receives_share_calls_and_each_message_reaches_one_caller(
        server: ServerProcess) -> None:
    """16 consumers, each receiving one message at a time and deleting it: they share
    ReceiveMessage calls, and every message is received by exactly one of them, once."""
    async def main() -> tuple[list[str], int, int]:
        async with AsyncClient(server.endpoint) as c:
            url = await c.create_queue(_name(), attributes={"VisibilityTimeout": "60"})
            for start in range(0, 200, 10):
                await c.send_message_batch(url, [{"Id": str(i), "MessageBody": f"m{start + i}"}
                                                 for i in range(10)])
            coalescer = c._receives
            assert coalescer is not None
            got: list[str] = []
            calls = 0
            run = coalescer._run

            async def counted(call: Call) -> Any:
                nonlocal calls
                calls += 1
                return await run(call)

            coalescer._run = counted

            async def consumer() -> None:
                while True:
                    msgs = await c.receive_message(url, wait_time_seconds=1)
                    if not msgs:
                        return
                    [m] = msgs
                    got.append(m.body)
                    await c.delete_message(url, m.receipt_handle)

            await asyncio.gather(*(consumer() for _ in range(16)))
            visible, in_flight = (int(v) for v in (await c.get_queue_attributes(
                url, ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
            )).values())
            return got, calls, visible + in_flight

    got, calls, left = asyncio.run(main())
    assert sorted(got) == sorted(f"m{i}" for i in range(200))  # each once
    assert calls < 100, f"{calls} ReceiveMessage calls for 200 messages"
    assert left == 0


def test_a_receiver_cancelled_mid_call_leaves_its_message_to_others(
        server: ServerProcess) -> None:
    async def main() -> tuple[list[str], list[str]]:
        async with AsyncClient(server.endpoint) as c:
            url = await c.create_queue(_name(), attributes={"VisibilityTimeout": "60"})
            await c.send_message_batch(url, [{"Id": str(i), "MessageBody": f"m{i}"}
                                             for i in range(2)])
            keep = asyncio.ensure_future(c.receive_message(url, wait_time_seconds=1))
            gone = asyncio.ensure_future(c.receive_message(url, wait_time_seconds=1))
            while c._receives.calls == 0:  # type: ignore[union-attr]
                await asyncio.sleep(0)
            gone.cancel()  # after its share was asked for, before it is answered
            kept = [m.body for m in await keep]
            await c._receives.wait_idle()  # type: ignore[union-attr]
            again = [m.body for m in await c.receive_message(url, 10, wait_time_seconds=1)]
            return kept, again

    kept, again = asyncio.run(main())
    assert len(kept) == 1
    assert sorted(kept + again) == ["m0", "m1"]  # visible again at once, not after 60 s


def test_threads_receiving_one_at_a_time_share_calls_and_each_message_reaches_one(
        server: ServerProcess) -> None:
    """The blocking client: 16 threads, each receiving one message at a time and deleting
    it, share ReceiveMessage calls; every message is received once."""
    with Client(server.endpoint) as c:
        url = c.create_queue(_name(), attributes={"VisibilityTimeout": "60"})
        for start in range(0, 200, 10):
            c.send_message_batch(url, [{"Id": str(i), "MessageBody": f"m{start + i}"}
                                       for i in range(10)])
        coalescer = c._receives
        assert coalescer is not None
        got: list[str] = []
        lock = threading.Lock()

        def consumer() -> None:
            while True:
                msgs = c.receive_message(url, wait_time_seconds=1)
                if not msgs:
                    return
                [m] = msgs
                with lock:
                    got.append(m.body)
                c.delete_message(url, m.receipt_handle)

        with ThreadPoolExecutor(16) as pool:
            for f in [pool.submit(consumer) for _ in range(16)]:
                f.result(60)
        assert sorted(got) == sorted(f"m{i}" for i in range(200))  # each once
        assert coalescer.calls < 150, f"{coalescer.calls} ReceiveMessage calls for 200"
        assert _depth(c, url) == (0, 0)
