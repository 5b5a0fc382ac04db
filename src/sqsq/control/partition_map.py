"""The partition map: a consistent, current view of /sqsq/ and the writes that change it.

``MapSnapshot`` is immutable and answers queue -> partitions -> shard -> replicas / leader
hint. ``PartitionMap`` loads one with a single range read at one revision, then follows the
prefix watch from the next revision, swapping in a new snapshot per watch batch; a batch
never splits an etcd revision, so every snapshot a reader sees is a state etcd had. While
etcd is unreachable the last snapshot keeps answering (the data path never waits on etcd).

Writes are transactions guarded on the mod revision the writer read (``Etcd.update`` and
``Etcd.compare_and_put``), so two controllers racing on one record cannot both win.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from sqsq.control import keys
from sqsq.control.etcd import Etcd, KeyValue, RangeResult
from sqsq.control.keys import LeaderHint, NodeRecord, QueueRecord, RecordError, ShardRecord
from sqsq.control.lease import Lease
from sqsq.control.watch import Watch, WatchBatch, watch_prefix
from sqsq.wire import home_partition, send_width

log = logging.getLogger(__name__)

_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class Route:
    shard_id: int
    epoch: int
    replicas: tuple[NodeRecord, ...]  # the live ones (a dead replica has no address)
    leader: NodeRecord | None  # the published hint, if its node is live; to be confirmed


@dataclass(frozen=True)
class MapSnapshot:
    revision: int = 0
    nodes: Mapping[str, NodeRecord] = field(default_factory=lambda: _EMPTY)  # live ones
    members: Mapping[str, NodeRecord] = field(default_factory=lambda: _EMPTY)  # every one
    shards: Mapping[int, ShardRecord] = field(default_factory=lambda: _EMPTY)
    queues: Mapping[str, QueueRecord] = field(default_factory=lambda: _EMPTY)
    leaders: Mapping[int, LeaderHint] = field(default_factory=lambda: _EMPTY)

    def queue(self, name: str) -> QueueRecord | None:
        return self.queues.get(name)

    def partitions(self, name: str) -> tuple[int, ...]:
        """The shard of each partition of ``name``; () for an unknown queue."""
        queue = self.queues.get(name)
        return queue.partitions if queue else ()

    def replicas(self, shard_id: int) -> tuple[str, ...]:
        shard = self.shards.get(shard_id)
        return shard.replicas if shard else ()

    def leader_hint(self, shard_id: int) -> NodeRecord | None:
        hint = self.leaders.get(shard_id)
        if hint is None or hint.node_id not in self.replicas(shard_id):
            return None  # a hint about a node no longer in the group misleads
        return self.nodes.get(hint.node_id)

    def send_partitions(self, name: str) -> tuple[int, int]:
        """Where a standard queue's sends go: its home partition and how many from there on
        (``sqsq.wire.send_width``, from whether each partition's leader says it is busy; a
        partition with no known leader counts as not busy). (0, 0) for an unknown queue."""
        shards = self.partitions(name)
        if not shards:
            return 0, 0
        home = home_partition(name, len(shards))
        busy = []
        for shard in shards:
            leader = self.leader_hint(shard)
            busy.append(leader is not None and leader.busy)
        return home, send_width(home, busy)

    def route(self, name: str, partition: int) -> Route | None:
        """Where partition ``partition`` of queue ``name`` lives; None if unknown."""
        shards = self.partitions(name)
        if not 0 <= partition < len(shards):
            return None
        shard = self.shards.get(shards[partition])
        if shard is None:
            return None
        live = tuple(self.nodes[n] for n in shard.replicas if n in self.nodes)
        return Route(shard.shard_id, shard.epoch, live, self.leader_hint(shard.shard_id))

    def applied(self, puts: list[KeyValue], deletes: list[str], revision: int) -> MapSnapshot:
        """This snapshot with the changes of one revision batch; copies only what changed."""
        tables: dict[str, dict] = {}

        def table(kind: str) -> dict:
            if kind not in tables:
                tables[kind] = dict(getattr(self, kind))
            return tables[kind]

        for key in deletes:
            try:
                kind, ident = keys.parse_key(key)
            except RecordError:
                continue  # not a record (a joined marker, or something else under /sqsq/)
            table(kind).pop(_ident(kind, ident), None)
        for kv in puts:
            try:
                kind, ident = keys.parse_key(kv.key)
            except RecordError:
                continue
            try:
                record = keys.decode(kv.key, kv.value)
            except RecordError as exc:
                # Routing on a corrupt record would be worse than not knowing it: drop it,
                # and say so.
                log.error("partition map: ignoring %s at revision %d: %s",
                          kv.key, kv.mod_revision, exc)
                table(kind).pop(_ident(kind, ident), None)
                continue
            table(kind)[_ident(kind, ident)] = record
        frozen = {kind: MappingProxyType(t) for kind, t in tables.items()}
        return replace(self, revision=revision, **frozen)

    @classmethod
    def from_range(cls, result: RangeResult) -> MapSnapshot:
        return cls().applied(list(result.kvs), [], result.revision)


def _ident(kind: str, ident: str) -> str | int:
    """How a table is keyed: shards and leaders by shard id, the rest by name."""
    return int(ident) if kind in ("shards", "leaders") and ident.isdigit() else ident


class PartitionMap:
    """A ``MapSnapshot`` kept current by a watch. ``await PartitionMap.load(etcd)``."""

    def __init__(self, etcd: Etcd, snapshot: MapSnapshot) -> None:
        self.etcd = etcd
        self.snapshot = snapshot
        self._changed = asyncio.Condition()
        self.watch: Watch = watch_prefix(etcd, keys.ROOT, snapshot.revision + 1)
        self._task = asyncio.get_running_loop().create_task(self._follow())

    @classmethod
    async def load(cls, etcd: Etcd) -> PartitionMap:
        return cls(etcd, MapSnapshot.from_range(await etcd.get_prefix(keys.ROOT)))

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        await self.watch.close()

    async def _follow(self) -> None:
        async for batch in self.watch:
            self._apply(batch)
            async with self._changed:
                self._changed.notify_all()

    def _apply(self, batch: WatchBatch) -> None:
        if batch.reset is not None:
            self.snapshot = MapSnapshot.from_range(batch.reset)
            return
        puts = [ev.kv for ev in batch.events if ev.kv is not None]
        deletes = [ev.key for ev in batch.events if ev.kv is None]
        self.snapshot = self.snapshot.applied(puts, deletes, batch.revision)

    async def wait_for(self, predicate: Callable[[MapSnapshot], bool],
                       timeout_s: float = 10.0) -> MapSnapshot:
        """The first snapshot (the current one included) for which ``predicate`` holds."""
        async def wait() -> MapSnapshot:
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self.snapshot))
                return self.snapshot

        return await asyncio.wait_for(wait(), timeout_s)

    async def wait_revision(self, revision: int, timeout_s: float = 10.0) -> MapSnapshot:
        """Wait until the map has seen ``revision`` (e.g. one this process just wrote)."""
        return await self.wait_for(lambda s: s.revision >= revision, timeout_s)


# -- writes: each guarded on what was read ---------------------------------------------------

async def register_node(etcd: Etcd, node: NodeRecord, lease: Lease) -> int:
    """Publish ``node`` under its lease (it disappears when the lease does)."""
    return await etcd.put(keys.node_key(node.node_id), keys.encode(node), lease=lease.id)


async def create_shard(etcd: Etcd, shard: ShardRecord) -> int:
    """Create a shard record; ``CasConflict`` if the shard id is taken."""
    return await etcd.compare_and_put(keys.shard_key(shard.shard_id), keys.encode(shard), 0)


async def create_queue(etcd: Etcd, queue: QueueRecord) -> int:
    """Create a queue record; ``CasConflict`` if the name is taken."""
    return await etcd.compare_and_put(keys.queue_key(queue.name), keys.encode(queue), 0)


async def change_replicas(etcd: Etcd, read: ShardRecord, read_mod_revision: int,
                          replicas: tuple[str, ...]) -> ShardRecord:
    """Move shard ``read`` to ``replicas`` (epoch + 1) if nobody changed it since it was
    read at ``read_mod_revision``; ``CasConflict`` otherwise."""
    new = read.with_replicas(replicas)
    await etcd.compare_and_put(keys.shard_key(read.shard_id), keys.encode(new),
                               read_mod_revision)
    return new


async def publish_leader(etcd: Etcd, hint: LeaderHint, lease: Lease) -> bool:
    """Publish a leader hint under the leader's lease unless a hint of a later Raft term
    is already there. True if ours is now published."""
    def change(current: KeyValue | None) -> bytes | None:
        if current is not None:
            try:
                if keys.decode_leader(current.value).term > hint.term:
                    return None
            except RecordError:
                pass  # a corrupt hint is overwritten
        return keys.encode(hint)

    key = keys.leader_key(hint.shard_id)
    await etcd.update(key, change, lease=lease.id)
    now = await etcd.get(key)
    return now is not None and now.value == keys.encode(hint)
