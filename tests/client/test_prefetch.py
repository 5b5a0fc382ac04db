"""Receive prefetch against a real server: messages received ahead are handed out one by one,
never once their visibility timeout is about to run out (a clock the test moves stands in
for waiting), and what is still held is released on close."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from serverproc import ServerProcess
from sqsq.client import AsyncClient, Client, Message
from sqsq.errors import InvalidParameterValue


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _queue(c: Client, n: int, visibility_timeout: int = 30) -> str:
    url = c.create_queue(f"pf-{uuid.uuid4().hex[:12]}",
                         attributes={"VisibilityTimeout": str(visibility_timeout)})
    if n:
        c.send_message_batch(url, [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(n)])
    return url


def _fill(p: object, want: int) -> list[Message]:
    """Receive through the prefetcher until it has taken ``want`` messages from the queue."""
    out: list[Message] = []
    for _ in range(20):
        out += p.receive(1, wait_time_seconds=1)  # type: ignore[attr-defined]
        if len(out) + p.buffered >= want:  # type: ignore[attr-defined]
            return out
    raise AssertionError(f"only {len(out)} + {p.buffered} of {want} received")  # type: ignore


def test_one_receive_call_serves_many_and_nothing_near_its_timeout_is_handed_out(
        server: ServerProcess) -> None:
    clock = Clock()
    with Client(server.endpoint) as c:
        url = _queue(c, 6, visibility_timeout=30)  # the queue's timeout is the one in force
        p = c.prefetcher(url, buffer=10, safety_margin_s=5, clock=clock)
        first = _fill(p, 6)
        assert len(first) == 1 and p.buffered == 5
        clock.now += 20  # 10 s left of 30: still more than the 5 s margin
        second = p.receive(2, wait_time_seconds=0)
        assert len(second) == 2 and p.buffered == 3
        clock.now += 6  # 4 s left: too little to hand out
        assert p.receive(10, wait_time_seconds=0) == []
        assert p.dropped == 3 and p.buffered == 0
        # The dropped ones are still invisible on the server (its real timeout runs on),
        # so nothing was handed out twice; the other consumer sees an empty queue.
        assert c.receive_message(url, 10, wait_time_seconds=0) == []
        handed = {m.message_id for m in first + second}
        assert len(handed) == 3
        p.close()


def test_the_prefetchers_own_visibility_timeout_sets_the_deadline(
        server: ServerProcess) -> None:
    clock = Clock()
    with Client(server.endpoint) as c:
        url = _queue(c, 3, visibility_timeout=600)
        with c.prefetcher(url, buffer=3, visibility_timeout=10, clock=clock) as p:
            assert len(_fill(p, 3)) == 1
            clock.now += 8.5  # 1.5 s left of 10, under the default margin (a fifth: 2 s)
            assert p.receive(5, wait_time_seconds=0) == [] and p.dropped == 2


def test_close_releases_held_messages_to_other_consumers(server: ServerProcess) -> None:
    with Client(server.endpoint) as c:
        url = _queue(c, 5, visibility_timeout=300)
        p = c.prefetcher(url, buffer=10)
        taken = _fill(p, 5)
        held = p.buffered
        assert held == 5 - len(taken) and held > 0
        assert c.receive_message(url, 10, wait_time_seconds=0) == []  # all held or taken
        p.close()
        assert p.receive(1, wait_time_seconds=0) == []  # closed: hands nothing out
        again = c.receive_message(url, 10, wait_time_seconds=0)  # no wait: visible at once
        assert len(again) == held
        assert {m.message_id for m in again}.isdisjoint(m.message_id for m in taken)


def test_async_prefetcher_receives_ahead_and_releases_on_close(server: ServerProcess) -> None:
    with Client(server.endpoint) as c:
        url = _queue(c, 4, visibility_timeout=300)

    async def main() -> tuple[list[Message], list[Message]]:
        async with AsyncClient(server.endpoint) as c:
            taken: list[Message] = []
            async with c.prefetcher(url, buffer=10, wait_time_seconds=1) as p:
                async for m in p:
                    taken.append(m)
                    if len(taken) + p.buffered >= 4:
                        break
            again = await c.receive_message(url, 10, wait_time_seconds=0)
            return taken, again

    taken, again = asyncio.run(main())
    assert len(taken) + len(again) == 4
    assert len(again) >= 1  # what the prefetcher still held came back at once
    assert {m.body for m in taken + again} == {f"m{i}" for i in range(4)}


def test_a_timeout_that_leaves_no_margin_is_refused() -> None:
    with Client("127.0.0.1:1") as c:  # refused before any call
        with pytest.raises(InvalidParameterValue):
            c.prefetcher("q", visibility_timeout=5, safety_margin_s=5)
        with pytest.raises(InvalidParameterValue):
            c.prefetcher("q", buffer=11)
