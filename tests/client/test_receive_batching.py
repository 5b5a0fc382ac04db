"""Concurrent receives coalesced into one ReceiveMessage: against a fake transport (what goes
out, when, and what each caller gets), and against a real server (no message received that
no caller asked for)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from serverproc import ServerProcess
from sqsq.client import AsyncClient, Client, _ops
from sqsq.client._call import Call
from sqsq.client.receive_batching import AsyncReceiveCoalescer, ReceiveCoalescer
from sqsq.errors import QueueDoesNotExist

Q = "http://127.0.0.1/000000000000/jobs"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeQueue:
    """Answers receives from a list of bodies; records every call. ``hold`` keeps a call
    from returning until released (so the test controls what is in flight)."""

    def __init__(self, bodies: list[str]) -> None:
        self.bodies = list(bodies)
        self.calls: list[tuple[int, int]] = []  # (max_number_of_messages, wait_time_seconds)
        self.hold: asyncio.Event | None = None

    async def run(self, call: Call) -> list[str]:
        req = call.request
        self.calls.append((req.max_number_of_messages, req.wait_time_seconds))
        if self.hold is not None:
            await self.hold.wait()
        n = req.max_number_of_messages
        out, self.bodies = self.bodies[:n], self.bodies[n:]
        return out


def _receive(n: int = 1, wait: int | None = 5, queue: str = Q, attempt: str = "") -> Call:
    return _ops.receive_message(queue, n, wait_time_seconds=wait,
                                receive_request_attempt_id=attempt)


async def _spin() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_lone_receive_goes_out_at_once_as_itself() -> None:
    async def main() -> None:
        fake = FakeQueue(["a", "b"])
        rc = AsyncReceiveCoalescer(fake.run, 1, FakeClock())
        task = asyncio.ensure_future(rc.receive(_receive(1, 7)))
        await asyncio.sleep(0)  # one step of the caller: its call is made
        assert fake.calls == [(1, 7)]
        assert await task == ["a"]

    asyncio.run(main())


def test_receives_waiting_behind_one_in_flight_share_one_call_in_call_order() -> None:
    async def main() -> None:
        fake = FakeQueue([f"m{i}" for i in range(10)])
        fake.hold = asyncio.Event()
        rc = AsyncReceiveCoalescer(fake.run, 1, FakeClock())
        first = asyncio.ensure_future(rc.receive(_receive(1)))
        await _spin()
        rest = [asyncio.ensure_future(rc.receive(_receive(n))) for n in (2, 1, 3)]
        await _spin()
        fake.hold.set()
        got = [await first] + [await t for t in rest]
        assert fake.calls == [(1, 5), (6, 5)]  # the three waiting asked for 2+1+3 at once
        assert got == [["m0"], ["m1", "m2"], ["m3"], ["m4", "m5", "m6"]]
        assert fake.bodies == [f"m{i}" for i in range(7, 10)]  # nothing taken unasked

    asyncio.run(main())


def test_a_caller_that_got_nothing_waits_out_its_own_long_poll() -> None:
    async def main() -> None:
        clock = FakeClock()
        fake = FakeQueue(["only"])
        fake.hold = asyncio.Event()
        rc = AsyncReceiveCoalescer(fake.run, 1, clock)
        first = asyncio.ensure_future(rc.receive(_receive(1, 5)))
        await _spin()
        a = asyncio.ensure_future(rc.receive(_receive(1, 5)))
        b = asyncio.ensure_future(rc.receive(_receive(1, 5)))
        await _spin()
        clock.now += 2  # the first call returns two seconds in: a and b have 3 s left
        fake.bodies = []  # the first takes nothing either: a message comes later
        fake.hold.set()
        assert await first == []
        await _spin()
        fake.bodies = ["late"]
        assert await a == ["late"]
        clock.now += 3.5
        assert await b == []  # its wait is over: it is answered, empty
        assert fake.calls[0] == (1, 5)
        assert fake.calls[1] == (2, 3)  # a and b together, for the 3 s they had left
        assert all(w <= 3 for _, w in fake.calls[1:])

    asyncio.run(main())


def test_a_failed_receive_reaches_every_caller_in_it() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        calls = 0

        async def run(call: Call) -> Any:
            nonlocal calls
            calls += 1
            await gate.wait()
            raise QueueDoesNotExist("The specified queue does not exist.")

        rc = AsyncReceiveCoalescer(run, 1, FakeClock())
        tasks = [asyncio.ensure_future(rc.receive(_receive())) for _ in range(4)]
        await _spin()
        gate.set()
        errors = await asyncio.gather(*tasks, return_exceptions=True)
        assert calls == 2  # the first alone, then the three that waited together
        assert all(isinstance(e, QueueDoesNotExist) for e in errors)
        assert len({id(e) for e in errors}) == 4  # each caller its own exception

    asyncio.run(main())


@pytest.mark.parametrize("call", [
    _receive(1, None),  # the queue's default wait, unknown here
    _receive(1, 5, queue=Q + ".fifo"),
    _receive(1, 5, attempt="retry-1"),
], ids=["no-wait", "fifo", "attempt-id"])
def test_receives_that_cannot_be_shared_each_go_alone(call: Call) -> None:
    async def main() -> None:
        fake = FakeQueue([f"m{i}" for i in range(10)])
        fake.hold = asyncio.Event()
        rc = AsyncReceiveCoalescer(fake.run, 1, FakeClock())
        tasks = [asyncio.ensure_future(rc.receive(call)) for _ in range(3)]
        await _spin()
        assert len(fake.calls) == 3  # all three in flight at once, none waited
        fake.hold.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())


def test_threads_share_receives_and_each_gets_its_own_messages() -> None:
    bodies = [f"m{i}" for i in range(30)]
    lock = threading.Lock()
    first_in = threading.Event()
    release = threading.Event()
    calls: list[int] = []

    def run(call: Call) -> list[str]:
        with lock:
            calls.append(call.request.max_number_of_messages)
            first = len(calls) == 1
        if first:
            first_in.set()
            release.wait(10)
        with lock:
            n = call.request.max_number_of_messages
            out, bodies[:] = bodies[:n], bodies[n:]
            return out

    rc = ReceiveCoalescer(run, 1)
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(rc.receive, _receive())]
        assert first_in.wait(10)
        futures += [pool.submit(rc.receive, _receive()) for _ in range(11)]
        while rc._lanes and sum(len(lane.pending) for lane in rc._lanes.values()) < 11:
            threading.Event().wait(0.001)
        release.set()
        got = [f.result(10) for f in futures]
    assert calls == [1, 10, 1]  # one alone, then ten together, then the last
    assert sorted(m for g in got for m in g) == sorted(f"m{i}" for i in range(12))
    assert all(len(g) == 1 for g in got)


def test_real_server_coalesced_receives_take_only_what_their_callers_asked(
        server: ServerProcess) -> None:
    with Client(server.endpoint) as c:
        url = c.create_queue(f"rb-{uuid.uuid4().hex[:10]}")
        c.send_message_batch(url, [{"Id": str(i), "MessageBody": f"b{i}"} for i in range(10)])
        c.send_message_batch(url, [{"Id": str(i), "MessageBody": f"c{i}"} for i in range(10)])

    async def main() -> tuple[list[list[Any]], Counter[str]]:
        async with AsyncClient(server.endpoint) as ac:
            seen: Counter[str] = Counter()
            run = ac._receives._run

            async def counted(call: Call) -> Any:
                seen[call.method] += 1
                return await run(call)

            ac._receives._run = counted
            got = await asyncio.gather(*(
                ac.receive_message(url, 1, visibility_timeout=60, wait_time_seconds=2)
                for _ in range(12)))
            return got, seen

    got, seen = asyncio.run(main())
    received = [m for g in got for m in g]
    assert all(len(g) == 1 for g in got)  # everyone got exactly what it asked for
    assert len({m.message_id for m in received}) == 12
    assert seen["ReceiveMessage"] < 12
    with Client(server.endpoint) as c:
        attrs = c.get_queue_attributes(url, ["All"])
    # Nothing received that no caller holds: 12 in flight, 8 still visible.
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "12"
    assert attrs["ApproximateNumberOfMessages"] == "8"
