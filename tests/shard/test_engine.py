"""The shard engine in process, over the memory store: when answers go out, what a poll
leaves behind. An fsync that blocks until the test lets it go stands in for a slow disk."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sqsq.core import commands as c
from sqsq.core.state import ShardConfig
from sqsq.errors import QueueDoesNotExist, ServiceUnavailable
from sqsq.gateway.api import Endpoint, QueueApi
from sqsq.shard.engine import ShardEngine
from sqsq.shard.store import MemoryStore


class GatedStore(MemoryStore):
    """fsync waits for the test to open the gate (it runs in the engine's fsync thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def sync(self) -> None:
        assert self.gate.wait(timeout=30), "the test never opened the fsync gate"
        super().sync()


async def _turns(n: int = 20) -> None:
    for _ in range(n):  # let the committer and its tasks run; no time passes
        await asyncio.sleep(0)


def test_a_read_is_answered_only_once_what_it_saw_is_on_disk() -> None:
    async def scenario() -> None:
        store = GatedStore()
        engine = ShardEngine(store, ShardConfig(0, b"k"))
        await engine.start()
        api = QueueApi(engine, Endpoint())
        create = asyncio.create_task(api.create_queue("q"))
        while engine._written < 1:  # noqa: SLF001 - the create is written, not yet synced
            await asyncio.sleep(0.001)
        lookup = asyncio.create_task(api.get_queue_url("q"))
        await _turns()
        # The queue is in the store, but neither the creator nor anyone else hears of it yet.
        assert not create.done() and not lookup.done()
        store.gate.set()
        assert (await create) == (await lookup) == "http://127.0.0.1:9324/000000000000/q"
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_long_poll_on_a_missing_queue_leaves_nothing_parked() -> None:
    async def scenario() -> None:
        store = MemoryStore()
        engine = ShardEngine(store, ShardConfig(0, b"k"), sync=False)
        await engine.start()
        api = QueueApi(engine, Endpoint())
        for i in range(5):
            with pytest.raises(QueueDoesNotExist):
                await api.receive_message(f"made-up-{i}", wait_time_seconds=1)
        assert len(engine.waiters) == 0
        await api.create_queue("real")
        poll = asyncio.create_task(api.receive_message("real", wait_time_seconds=5))
        await _turns()
        assert len(engine.waiters) == 1  # a poll on a real queue does park
        assert isinstance(await engine.execute(c.SendMessages(
            "real", (c.SendEntry("0", "hi"),))), c.BatchResult)
        assert [m.body for m in await poll] == ["hi"]
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 30))


class FailingSyncStore(MemoryStore):
    def sync(self) -> None:
        raise OSError("disk gone")


def test_after_a_failed_fsync_reads_fail_at_once_too() -> None:
    async def scenario() -> None:
        engine = ShardEngine(FailingSyncStore(), ShardConfig(0, b"k"))
        await engine.start()
        api = QueueApi(engine, Endpoint())
        with pytest.raises(ServiceUnavailable):
            await api.create_queue("q")  # its fsync fails: never acknowledged
        with pytest.raises(ServiceUnavailable):
            await api.get_queue_url("q")  # neither is the queue it may have written
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 30))
