"""The leader's time-driven work, checked by one scheduler per process: an idle shard's check
reads nothing from its store, and timers still come due on a replicated shard."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

from serverproc import free_port
from shardgroup import Group, run, until
from sqsq.api import Endpoint
from sqsq.core import commands as c
from sqsq.core.state import ShardConfig
from sqsq.shard.engine import ShardEngine
from sqsq.shard.host import Peer, ReplicaOptions, open_replica
from sqsq.shard.service import ShardService
from sqsq.shard.store import Store


class CountingStore:
    """The replica's store, counting what is read from it."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.reads = 0

    def get(self, key: bytes) -> bytes | None:
        self.reads += 1
        return self.inner.get(key)

    def scan(self, start: bytes, end: bytes, *, reverse: bool = False
             ) -> Iterator[tuple[bytes, bytes]]:
        self.reads += 1
        return self.inner.scan(start, end, reverse=reverse)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


async def _single(directory: Path) -> ShardEngine:
    me = Peer("127.0.0.1", 0, free_port())
    engine = open_replica(0, directory, ShardConfig(0, b"k" * 32), me, [me],
                          ReplicaOptions(bootstrap=True, memory=True))
    await engine.start()
    assert await engine.wait_leading(10.0)
    return engine


def test_an_idle_leader_decides_it_has_nothing_to_sweep_without_reading_its_store(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = await _single(tmp_path)
        api = ShardService(engine, Endpoint())
        await api.create_queue("orders", {"DelaySeconds": "900"})
        await api.send_message_batch("orders", [c.SendEntry("0", "later")])
        engine.check_sweep()  # the state changed: it looks once
        await until(lambda: engine._sweeping is None)
        engine.check_sweep()
        counting = CountingStore(engine.machine.store.inner)
        engine.machine.store.inner = counting
        applied = engine.applied_index
        for _ in range(100):
            engine.check_sweep()
        assert counting.reads == 0, f"{counting.reads} reads to find nothing due"
        assert engine.applied_index == applied
        engine.machine.store.inner = counting.inner
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_an_in_flight_message_comes_back_when_its_visibility_timeout_ends(
        tmp_path: Path) -> None:
    """Only a sweep moves it back in the counts (a receive would find it on its own)."""

    async def scenario(group: Group) -> None:
        lead = await group.settled_leader()
        api = ShardService(lead, Endpoint())
        await api.create_queue("orders")
        await api.send_message_batch("orders", [c.SendEntry("0", "again")])
        [m] = await api.receive_message("orders", visibility_timeout=1)
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        assert await api.get_queue_attributes("orders", names) == {
            names[0]: "0", names[1]: "1"}

        async def visible() -> bool:
            return (await api.get_queue_attributes("orders", names))[names[0]] == "1"

        async with asyncio.timeout(30):
            while not await visible():
                await asyncio.sleep(0.05)
        [again] = await api.receive_message("orders")
        assert again.message_id == m.message_id
        for e in group.engines:  # every replica applied the sweep
            await until(lambda e=e: e.applied_index == lead.applied_index)

    run(scenario, tmp_path)
