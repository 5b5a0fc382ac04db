"""The partition map: routing answers from a snapshot, kept current by another client's
writes to a real etcd."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from etcdproc import EtcdProcess
from sqsq.control import keys
from sqsq.control.etcd import CasConflict, Etcd, KeyValue, RangeResult
from sqsq.control.keys import LeaderHint, NodeRecord, QueueRecord, ShardRecord
from sqsq.control.lease import Lease
from sqsq.control.partition_map import (
    MapSnapshot,
    PartitionMap,
    change_replicas,
    create_queue,
    create_shard,
    publish_leader,
    register_node,
)
from sqsq.wire import home_partition


def kv(key: str, record: keys.Record | bytes, revision: int) -> KeyValue:
    value = record if isinstance(record, bytes) else keys.encode(record)
    return KeyValue(key, value, revision, revision, 1, 0)


def nodes(*ids: str) -> list[NodeRecord]:
    return [NodeRecord(n, f"127.0.0.1:{7400 + i}", f"127.0.0.1:{7500 + 100 * i}")
            for i, n in enumerate(ids)]


def test_a_snapshot_routes_queue_to_partition_to_shard_to_replicas_and_leader() -> None:
    a, b, c = nodes("a", "b", "c")
    snap = MapSnapshot.from_range(RangeResult((
        kv(keys.node_key("a"), a, 2), kv(keys.node_key("b"), b, 3), kv(keys.node_key("c"), c, 4),
        kv(keys.shard_key(0), ShardRecord(0, ("a", "b", "c"), 1), 5),
        kv(keys.shard_key(1), ShardRecord(1, ("b", "c", "a"), 1), 6),
        kv(keys.queue_key("jobs"), QueueRecord("jobs", "q1", (1, 0)), 7),
        kv(keys.leader_key(1), LeaderHint(1, "c", 3), 8),
        kv(keys.queue_key("broken"), b"{not json", 9),
    ), 9))
    assert snap.revision == 9
    assert snap.partitions("jobs") == (1, 0)
    route = snap.route("jobs", 0)
    assert route is not None and route.shard_id == 1
    assert [n.node_id for n in route.replicas] == ["b", "c", "a"]
    assert route.leader == c
    assert snap.route("jobs", 1).leader is None  # type: ignore[union-attr]  # no hint yet
    assert snap.route("jobs", 2) is None and snap.route("missing", 0) is None
    assert snap.queue("broken") is None  # a corrupt record is not routed on

    # One batch: node c dies (its key and its hint go), shard 1 moves to a new replica set.
    later = snap.applied([kv(keys.shard_key(1), ShardRecord(1, ("b", "a", "d"), 2), 10)],
                         [keys.node_key("c"), keys.leader_key(1)], 10)
    route = later.route("jobs", 0)
    assert route is not None and route.epoch == 2 and route.leader is None
    assert [n.node_id for n in route.replicas] == ["b", "a"]  # d has not registered yet
    assert snap.route("jobs", 0).epoch == 1  # type: ignore[union-attr]  # old one unchanged


def test_a_hint_for_a_node_outside_the_replica_set_is_not_given() -> None:
    a, = nodes("a")
    snap = MapSnapshot.from_range(RangeResult((
        kv(keys.node_key("a"), a, 2),
        kv(keys.shard_key(0), ShardRecord(0, ("x", "y", "z"), 1), 3),
        kv(keys.leader_key(0), LeaderHint(0, "a", 1), 4),
    ), 4))
    assert snap.leader_hint(0) is None


def test_a_standard_queues_sends_stay_home_until_its_leader_is_busy() -> None:
    """Every gateway and client reads the same home partition for a queue; while the leader
    there says it is busy the sends take the next partitions up to one whose leader is not
    (a partition without a known leader counts as not busy)."""
    a, b, c = nodes("a", "b", "c")
    shards = [kv(keys.shard_key(s), ShardRecord(s, ("a", "b", "c"), 1), 5 + s)
              for s in range(4)]
    hints = [kv(keys.leader_key(s), LeaderHint(s, "abca"[s], 1), 10 + s) for s in range(4)]
    queue = kv(keys.queue_key("jobs"), QueueRecord("jobs", "q1", (0, 1, 2, 3)), 20)

    def snapshot(*busy: str, leaders: list[KeyValue] = hints) -> MapSnapshot:
        records = [kv(keys.node_key(n.node_id), replace(n, busy=n.node_id in busy), 2)
                   for n in (a, b, c)]
        return MapSnapshot.from_range(RangeResult((*records, *shards, *leaders, queue), 20))

    home, width = snapshot().send_partitions("jobs")
    assert 0 <= home < 4 and width == 1
    assert home == home_partition("jobs", 4) == snapshot("a", "b").send_partitions("jobs")[0]
    leader = "abca"[home]
    _, width = snapshot(leader).send_partitions("jobs")
    assert width == (3 if leader == "a" and home == 3 else 2)  # past a's other partition too
    assert snapshot("a", "b", "c").send_partitions("jobs") == (home, 4)
    no_hints = snapshot("a", "b", "c", leaders=[])
    assert no_hints.send_partitions("jobs") == (home, 1)
    assert snapshot().send_partitions("missing") == (0, 0)
    homes = {home_partition(f"queue-{i}", 4) for i in range(40)}
    assert homes == {0, 1, 2, 3}  # a cluster's queues spread their homes over its shards


def test_the_map_follows_changes_made_by_another_client(etcd_proc: EtcdProcess) -> None:
    async def scenario() -> None:
        async with Etcd(etcd_proc.endpoint) as gateway, Etcd(etcd_proc.endpoint) as ctl:
            pmap = await PartitionMap.load(gateway)
            assert pmap.snapshot.route("jobs", 0) is None

            leases = [await Lease.grant(ctl, 10) for _ in range(4)]
            for node, lease in zip(nodes("a", "b", "c", "d"), leases, strict=True):
                await register_node(ctl, node, lease)
            await create_shard(ctl, ShardRecord(0, ("a", "b", "c"), 1))
            await create_queue(ctl, QueueRecord("jobs", "q-jobs", (0,)))
            with pytest.raises(CasConflict):  # the name is taken
                await create_queue(ctl, QueueRecord("jobs", "other", (0,)))
            assert await publish_leader(ctl, LeaderHint(0, "b", 4), leases[1])
            assert not await publish_leader(ctl, LeaderHint(0, "a", 3), leases[0])  # older

            snap = await pmap.wait_for(lambda s: s.leader_hint(0) is not None)
            route = snap.route("jobs", 0)
            assert route is not None and route.leader is not None
            assert route.leader.node_id == "b" and route.leader.grpc_address == "127.0.0.1:7401"
            assert snap.queue("jobs") == QueueRecord("jobs", "q-jobs", (0,))

            # Node c's lease ends: its key leaves the map; the controller moves its replica.
            await leases[2].revoke()
            read = await ctl.get(keys.shard_key(0))
            assert read is not None
            shard = keys.decode_shard(read.value)
            moved = await change_replicas(ctl, shard, read.mod_revision, ("a", "b", "d"))
            with pytest.raises(CasConflict):  # a second controller acting on the same read
                await change_replicas(ctl, shard, read.mod_revision, ("a", "b", "c"))
            snap = await pmap.wait_for(lambda s: s.shards[0].epoch == moved.epoch)
            assert "c" not in snap.nodes
            assert [n.node_id for n in snap.route("jobs", 0).replicas] == ["a", "b", "d"]  # type: ignore[union-attr]

            # Everything written so far is in the map once it reaches the writer's revision.
            last = await ctl.delete(keys.queue_key("jobs"))
            snap = await pmap.wait_revision(last)
            assert snap.route("jobs", 0) is None
            assert pmap.watch.restarts == 0
            await pmap.close()
            for lease in leases:
                await lease.revoke()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_map_keeps_answering_while_etcd_is_down_and_catches_up_after(
        etcd_proc: EtcdProcess) -> None:
    async def scenario() -> None:
        async with Etcd(etcd_proc.endpoint) as gateway, Etcd(etcd_proc.endpoint) as ctl:
            await create_shard(ctl, ShardRecord(0, ("a", "b", "c"), 1))
            await create_queue(ctl, QueueRecord("q", "id-q", (0,)))
            pmap = await PartitionMap.load(gateway)
            await asyncio.to_thread(etcd_proc.stop)
            assert pmap.snapshot.partitions("q") == (0,)  # served from the last snapshot
            await asyncio.to_thread(etcd_proc.start)
            await create_queue(ctl, QueueRecord("r", "id-r", (0,)))
            snap = await pmap.wait_for(lambda s: s.queue("r") is not None)
            assert snap.partitions("q") == (0,) and snap.partitions("r") == (0,)
            await pmap.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
