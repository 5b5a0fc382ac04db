"""The controller: one active in the cluster at a time (an etcd election under the node's
lease), deciding what the partition map says:

- it creates the cluster's shards once enough nodes are live, placing each shard's replicas
  on distinct nodes (``placement``);
- when a node has been gone (its lease expired) for ``replace_after_s``, it gives each of the
  node's replicas to another live node: the shard's record gets the new replica set and a
  higher epoch, and the shard's leader carries it out in Raft (remove the dead member, add
  the new one; ``agent``). One change at a time in the whole cluster: the next waits until
  the leader of the last changed shard publishes a hint at the new epoch.

The time a node has been gone is measured by the controller from when it saw it go, so a
controller that has just taken over (or etcd that has just come back) replaces nothing
before every node has had ``replace_after_s`` to show it is alive.

Every write is a transaction guarded on what was read, so a controller that lost its
election without knowing yet cannot undo what its successor decided.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqsq.control import keys
from sqsq.control.etcd import CasConflict, Etcd, EtcdError
from sqsq.control.keys import REPLICATION_FACTOR, NodeRecord, ShardRecord
from sqsq.control.lease import Election, Lease, LeaseLost
from sqsq.control.partition_map import MapSnapshot, PartitionMap, create_shard
from sqsq.control.placement import (
    PlacementError,
    choose_replacement,
    dead_replicas,
    place_replicas,
    replace_replica,
)

log = logging.getLogger("sqsq.controller")

RETRY_S = 0.5
SETTLE_TIMEOUT_S = 120.0  # a change no leader confirms blocks the next one this long at most


@dataclass(frozen=True)
class ControllerSettings:
    shards: int = 1  # the cluster's shards, created once ``initial_nodes`` are live
    initial_nodes: int = REPLICATION_FACTOR  # so the first shards spread over all of them
    replace_after_s: float = 10.0


class Controller:
    def __init__(self, etcd: Etcd, me: NodeRecord, partition_map: PartitionMap,
                 settings: ControllerSettings, lease_of: Callable[[], Lease | None], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.etcd = etcd
        self.me = me
        self.map = partition_map
        self.shards = settings.shards
        self.initial_nodes = max(settings.initial_nodes, REPLICATION_FACTOR)
        self.replace_after_s = settings.replace_after_s
        self.lease_of = lease_of
        self.clock = clock
        self._gone_since: dict[str, float] = {}  # node id -> when this controller saw it go
        self._pending: tuple[int, int, float] | None = None  # shard, epoch, when changed

    async def run(self) -> None:
        """Campaign, lead until the lease is lost, campaign again; forever."""
        while True:
            lease = self.lease_of()
            if lease is None or not lease.alive:
                await asyncio.sleep(RETRY_S)
                continue
            election = Election(self.etcd, keys.CONTROLLER, self.me.node_id.encode(), lease)
            try:
                await election.campaign()
                log.info("controller: %s is active", self.me.node_id)
                await self._lead(lease)
            except (LeaseLost, EtcdError) as exc:
                log.warning("controller on %s: %s", self.me.node_id, exc)
                await asyncio.sleep(RETRY_S)

    async def _lead(self, lease: Lease) -> None:
        self._gone_since.clear()  # seen from now on: a new controller waits the full time
        self._pending = None
        while lease.alive:
            snapshot = self.map.snapshot
            await self.decide(snapshot)
            with contextlib.suppress(asyncio.TimeoutError):
                await self.map.wait_for(lambda s, r=snapshot.revision: s.revision > r,
                                        timeout_s=RETRY_S * 4)
        raise LeaseLost(f"lease lost: {lease.lost_reason}")

    async def decide(self, snapshot: MapSnapshot) -> None:
        """One round: whatever the map lacks that the controller can supply now."""
        await self._create_shards(snapshot)
        await self._replace_dead(snapshot)

    async def _create_shards(self, snapshot: MapSnapshot) -> None:
        missing = [s for s in range(self.shards) if s not in snapshot.shards]
        if not missing:
            return
        if not snapshot.shards and len(snapshot.nodes) < self.initial_nodes:
            log.info("controller: waiting for %d nodes before placing the first shards (%d "
                     "live)", self.initial_nodes, len(snapshot.nodes))
            return
        placed: list[ShardRecord] = list(snapshot.shards.values())
        for shard_id in missing:
            try:
                replicas = place_replicas(snapshot.nodes, placed, hosts=_hosts(snapshot))
            except PlacementError as exc:
                log.info("controller: shard %d waits: %s", shard_id, exc)
                return
            shard = ShardRecord(shard_id, replicas, 1)
            try:
                await create_shard(self.etcd, shard)
                log.info("controller: shard %d on %s", shard_id, ", ".join(replicas))
            except CasConflict:
                pass  # created meanwhile: the watch brings it
            placed.append(shard)

    async def _replace_dead(self, snapshot: MapSnapshot) -> None:
        now = self.clock()
        for node_id in snapshot.members:
            if node_id in snapshot.nodes:
                self._gone_since.pop(node_id, None)
            else:
                self._gone_since.setdefault(node_id, now)
        if self._pending is not None:
            shard_id, epoch, since = self._pending
            hint = snapshot.leaders.get(shard_id)
            if (hint is None or hint.epoch < epoch) and now - since < SETTLE_TIMEOUT_S:
                return  # the last change is still being carried out
            self._pending = None
        shards = list(snapshot.shards.values())
        due = [(s, n) for s, n in dead_replicas(shards, snapshot.nodes)
               if now - self._gone_since.get(n, now) >= self.replace_after_s]
        if not due:
            return
        shard_id, dead = due[0]
        shard = snapshot.shards[shard_id]
        try:
            new_node = choose_replacement(shard, dead, snapshot.nodes, shards,
                                          hosts=_hosts(snapshot))
        except PlacementError as exc:
            log.info("controller: shard %d keeps %s for now: %s", shard_id, dead, exc)
            return
        moved = replace_replica(shard, dead, new_node)

        # Only the record this decision was made from may be replaced.
        current = await self.etcd.get(keys.shard_key(shard_id))
        if current is None or keys.decode_shard(current.value) != shard:
            return  # changed meanwhile: decide again from the new map
        try:
            await self.etcd.compare_and_put(current.key, keys.encode(moved), current.mod_revision)
        except CasConflict:
            return
        log.info("controller: shard %d: %s replaces %s (epoch %d)", shard_id, new_node, dead,
                 moved.epoch)
        self._pending = (shard_id, moved.epoch, now)


def _hosts(snapshot: MapSnapshot) -> dict[str, str]:
    """Each node's host label: replicas of a shard go to different hosts."""
    return {n: record.host_label for n, record in snapshot.members.items()}
