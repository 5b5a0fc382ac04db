"""The engine's group commit: nobody is answered before an fsync covers their command; the
commands that arrive while an fsync runs share one batch write; a failing store or fsync
fails exactly the commands it could have lost."""

from __future__ import annotations

import asyncio
import threading

from sqsq.core import commands as c
from sqsq.core.errors import ErrorCode, Rejection
from sqsq.core.state import ShardConfig
from sqsq.shard.engine import ShardEngine
from sqsq.shard.store import MemoryStore


class GatedStore(MemoryStore):
    """A MemoryStore whose fsync waits for the test to open a gate, and which can fail."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.syncs = 0
        self.gate = threading.Event()
        self.gate.set()
        self.fail_write = False
        self.fail_sync = False

    def write(self, writes, *, sync: bool) -> None:  # noqa: ANN001
        if self.fail_write:
            raise OSError("disk on fire")
        self.writes += 1
        super().write(writes, sync=sync)

    def sync(self) -> None:
        self.gate.wait(10)
        if self.fail_sync:
            raise OSError("fsync: EIO")
        self.syncs += 1


def _send(body: str) -> c.SendMessages:
    return c.SendMessages("q", (c.SendEntry("0", body),))


async def _until(cond, timeout_s: float = 5.0) -> None:  # noqa: ANN001
    for _ in range(int(timeout_s / 0.005)):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def _engine(store: GatedStore) -> ShardEngine:
    engine = ShardEngine(store, ShardConfig())
    await engine.start()
    assert not isinstance(await engine.execute(c.CreateQueue("q")), Rejection)
    return engine


def test_commands_arriving_during_an_fsync_share_one_write_and_wait_for_the_next_fsync() -> None:
    async def run() -> None:
        store = GatedStore()
        engine = await _engine(store)
        writes_before, syncs_before = store.writes, store.syncs
        store.gate.clear()
        first = asyncio.ensure_future(engine.execute(_send("first")))
        await _until(lambda: store.writes == writes_before + 1)  # written, fsync now blocked
        later = [asyncio.ensure_future(engine.execute(_send(f"m{i}"))) for i in range(20)]
        await asyncio.sleep(0.05)
        assert not first.done() and not any(f.done() for f in later)
        assert store.writes == writes_before + 1  # applied, gathered, not written yet
        store.gate.set()
        results = await asyncio.gather(first, *later)
        assert all(isinstance(r, c.BatchResult) and len(r.successful) == 1 for r in results)
        assert store.writes == writes_before + 2  # the 20 went out as one batch
        assert store.syncs == syncs_before + 2  # ...covered by a second fsync
        assert engine.applied_index == 22  # create + first + 20
        got = await engine.execute(c.ReceiveMessages("q", 10, 30))
        assert isinstance(got, c.Received) and len(got.messages) == 10
        await engine.stop()

    asyncio.run(run())


def test_a_failed_fsync_fails_what_it_covered_and_what_waited_for_it() -> None:
    async def run() -> None:
        store = GatedStore()
        engine = await _engine(store)
        store.gate.clear()
        store.fail_sync = True
        first = asyncio.ensure_future(engine.execute(_send("first")))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(engine.execute(_send("second")))
        await asyncio.sleep(0.05)
        store.gate.set()
        for r in await asyncio.gather(first, second):
            assert isinstance(r, Rejection) and r.code is ErrorCode.SERVICE_UNAVAILABLE
        later = await engine.execute(_send("later"))
        assert isinstance(later, Rejection) and later.code is ErrorCode.SERVICE_UNAVAILABLE

    asyncio.run(run())


def test_a_failed_write_fails_its_group_and_still_answers_the_groups_written_before() -> None:
    async def run() -> None:
        store = GatedStore()
        engine = await _engine(store)
        store.gate.clear()
        first = asyncio.ensure_future(engine.execute(_send("first")))
        await asyncio.sleep(0.05)  # first is written; its fsync is held
        store.fail_write = True
        second = asyncio.ensure_future(engine.execute(_send("second")))
        await asyncio.sleep(0.05)
        store.gate.set()
        assert isinstance(await first, c.BatchResult)  # written before: durable, answered
        r = await second
        assert isinstance(r, Rejection) and r.code is ErrorCode.SERVICE_UNAVAILABLE

    asyncio.run(run())
