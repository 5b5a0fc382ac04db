"""A gateway's queue records: a queue deleted (or a create the shards refused, which frees
the name again) is gone from this gateway's map when the call returns, so a list right after
does not name it, though the map learns of the delete from its etcd watch a moment later."""

from __future__ import annotations

import asyncio
from typing import Any

from sqsq.api import Endpoint
from sqsq.control.keys import QueueRecord, encode, queue_key
from sqsq.control.partition_map import MapSnapshot
from sqsq.gateway.queuerecords import QueueRecords

RECORD = QueueRecord("jobs", "id-1", (1,))


class _KV:
    def __init__(self, key: str, value: bytes) -> None:
        self.key, self.value, self.mod_revision = key, value, 5


class _Etcd:
    def __init__(self) -> None:
        self.kv: _KV | None = _KV(queue_key(RECORD.name), encode(RECORD))

    async def get(self, key: str) -> _KV | None:
        return self.kv

    async def compare_and_delete(self, key: str, mod_revision: int) -> int:
        self.kv = None
        return 6


class _LaggingMap:
    """The gateway's map, fed by a watch the test delivers by hand."""

    def __init__(self) -> None:
        self.snapshot = MapSnapshot(revision=5, queues={RECORD.name: RECORD})
        self._changed = asyncio.Condition()

    async def deliver(self, snapshot: MapSnapshot) -> None:
        async with self._changed:
            self.snapshot = snapshot
            self._changed.notify_all()

    async def wait_for(self, predicate: Any, timeout_s: float = 10.0) -> MapSnapshot:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: predicate(self.snapshot)),
                                   timeout_s)
            return self.snapshot


def test_forget_returns_once_the_map_has_let_the_queue_go() -> None:
    async def run() -> None:
        etcd, lagging = _Etcd(), _LaggingMap()
        records = QueueRecords(etcd, lagging, Endpoint(), None)  # type: ignore[arg-type]
        forgetting = asyncio.ensure_future(records.forget(RECORD))
        for _ in range(20):
            await asyncio.sleep(0)
        assert etcd.kv is None  # deleted in etcd
        assert not forgetting.done()  # but this gateway's map still names it
        await lagging.deliver(MapSnapshot(revision=6))
        await asyncio.wait_for(forgetting, 5)
        assert lagging.snapshot.queue(RECORD.name) is None

    asyncio.run(run())
