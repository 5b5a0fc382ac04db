"""Where the gateway's receives from a partitioned queue look first (no network: the
partition map is given and the shards are a fake caller)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from fakeclock import ModuleClock
from fixedmap import FixedMap
from sqsq.api import Endpoint
from sqsq.client import _call
from sqsq.control.keys import QueueRecord
from sqsq.control.partition_map import MapSnapshot
from sqsq.gateway import cluster as gateway_cluster
from sqsq.gateway.cluster import ClusterApi
from sqsq.wire import ReceiveSpread

SHARDS = (10, 11, 12)


@dataclass
class Shards:
    """Every partition is empty, and only ``holding``'s long poll brings a message."""

    holding: int
    receives: ReceiveSpread = field(default_factory=lambda: ReceiveSpread(start=0))
    looked: list[tuple[int, int]] = field(default_factory=list)  # (shard, wait seconds)

    async def call(self, shard: int, call: _call.Call) -> list[str]:
        wait = call.request.wait_time_seconds
        self.looked.append((shard, wait))
        if wait == 0:
            return []
        if shard != self.holding:
            await asyncio.Event().wait()  # an empty long poll: cancelled by the winner
        await asyncio.sleep(0)
        return [f"message from {shard}"]


def _api(shards: Shards) -> ClusterApi:
    snapshot = MapSnapshot(nodes={}, members={}, shards={}, leaders={},
                           queues={"q": QueueRecord("q", "id-q", SHARDS)})
    api = ClusterApi(None, FixedMap(snapshot), Endpoint())  # type: ignore[arg-type]
    api.caller = shards  # type: ignore[assignment]
    return api


def test_a_long_poll_that_finds_messages_makes_its_partition_the_next_first() -> None:
    async def go() -> None:
        shards = Shards(holding=12)
        api = _api(shards)
        got = await api.receive_message("q", wait_time_seconds=5)
        assert got == ["message from 12"]
        # each partition looked at once, then a long poll at each
        assert shards.looked[:3] == [(10, 0), (11, 0), (12, 0)]
        assert sorted(shards.looked[3:]) == [(10, 5), (11, 5), (12, 5)]
        shards.looked.clear()
        await api.receive_message("q", wait_time_seconds=0)
        assert shards.looked[0] == (12, 0)  # where the long poll found messages

    asyncio.run(go())


@dataclass
class Taken:
    body: str
    receipt_handle: str


@dataclass
class TwoAtOnce:
    """Partitions 11 and 12 answer a long poll with a message in the same turn; 10 has none."""

    receives: ReceiveSpread = field(default_factory=lambda: ReceiveSpread(start=0))
    released: list[tuple[int, list[tuple[str, int]]]] = field(default_factory=list)

    async def call(self, shard: int, call: _call.Call) -> list[Taken]:
        if call.method == "ChangeMessageVisibilityBatch":
            self.released.append((shard, [(e.receipt_handle, e.visibility_timeout)
                                          for e in call.request.entries]))
            return []
        if call.request.wait_time_seconds == 0 or shard == 10:
            if call.request.wait_time_seconds:
                await asyncio.Event().wait()  # an empty long poll: cancelled by the winner
            return []
        await asyncio.sleep(0)
        return [Taken(f"message from {shard}", f"handle-{shard}")]


def test_messages_a_losing_long_poll_took_are_released_at_once() -> None:
    """Two partitions' long polls answer with messages together: the caller gets one
    partition's, and the other's are made visible again at once (visibility timeout 0),
    not left in flight for nobody until their visibility timeout ends."""
    async def go() -> None:
        shards = TwoAtOnce()
        api = _api(shards)  # type: ignore[arg-type]
        got = await api.receive_message("q", wait_time_seconds=5)
        assert [m.body for m in got] == ["message from 11"]
        for _ in range(10):
            await asyncio.sleep(0)
        assert shards.released == [(12, [("handle-12", 0)])]

    asyncio.run(asyncio.wait_for(go(), 10))


@dataclass
class SlowLook(Shards):
    """As ``Shards``, and the look at partition 11 takes a second on ``clock`` (its leader
    being elected); the long polls answer empty."""

    clock: ModuleClock = field(default_factory=ModuleClock)

    async def call(self, shard: int, call: _call.Call) -> list[str]:
        wait = call.request.wait_time_seconds
        self.looked.append((shard, wait))
        if wait == 0 and shard == 11:
            self.clock.advance(1.0)  # a call that finds the new leader a second later
        return []


def test_a_long_poll_after_a_slow_look_waits_only_what_is_left_of_its_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller asked for 3 s and the look at each partition took one: the long polls
    wait the 2 s left; asked for 1 s, there is none left and no long poll is made."""
    async def go(wait_s: int) -> list[tuple[int, int]]:
        shards = SlowLook(holding=-1)
        monkeypatch.setattr(gateway_cluster, "time", shards.clock)
        assert await _api(shards).receive_message("q", wait_time_seconds=wait_s) == []
        return shards.looked

    assert sorted(asyncio.run(go(3))) == [(10, 0), (10, 2), (11, 0), (11, 2), (12, 0), (12, 2)]
    assert asyncio.run(go(1)) == [(10, 0), (11, 0), (12, 0)]
