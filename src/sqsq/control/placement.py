"""Pure placement decisions for the controller: where replicas and partitions go.

Inputs are the records the partition map holds; outputs are ids. Every choice is
deterministic (ties broken by id), so two controllers that read the same map decide the
same, and a test can state the expected answer exactly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from sqsq.control.keys import REPLICATION_FACTOR, QueueRecord, ShardRecord


class PlacementError(Exception):
    """No placement satisfies the rules (too few live nodes or no shards)."""


def replica_load(shards: Iterable[ShardRecord]) -> Counter[str]:
    """How many replicas each node carries."""
    return Counter(node for shard in shards for node in shard.replicas)


def place_replicas(live_nodes: Iterable[str], shards: Iterable[ShardRecord],
                   count: int = REPLICATION_FACTOR,
                   hosts: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """``count`` live nodes for a new shard, each on another host (``hosts``: node id ->
    host label; a node missing there is a host of its own), the least loaded first."""
    load = replica_load(shards)
    nodes = sorted(set(live_nodes), key=lambda n: (load[n], n))
    if len(nodes) < count:
        raise PlacementError(f"{count} replicas need {count} live nodes, have {len(nodes)}")
    chosen: list[str] = []
    for node in nodes:
        if _host(hosts, node) not in {_host(hosts, n) for n in chosen}:
            chosen.append(node)
    if len(chosen) < count:
        raise PlacementError(
            f"{count} replicas need live nodes on {count} hosts, have "
            f"{len({_host(hosts, n) for n in nodes})} (nodes on one machine need a "
            "--host-label each to count as separate hosts)")
    return tuple(chosen[:count])


def _host(hosts: Mapping[str, str] | None, node: str) -> str:
    return (hosts or {}).get(node) or node


def assign_partitions(shard_ids: Iterable[int], queues: Iterable[QueueRecord],
                      partitions: int) -> tuple[int, ...]:
    """The shard of each of a new queue's ``partitions``.

    The least loaded shard (by partitions already assigned) takes each next partition, but
    a queue spreads over as many shards as it can first, so its partitions share no shard
    while there are enough shards.
    """
    ids = sorted(set(shard_ids))
    if not ids:
        raise PlacementError("no shards to assign partitions to")
    if partitions < 1:
        raise PlacementError(f"a queue has at least one partition, not {partitions}")
    load = Counter(s for q in queues for s in q.partitions)
    mine: Counter[int] = Counter()
    chosen = []
    for _ in range(partitions):
        shard = min(ids, key=lambda s: (mine[s], load[s], s))
        chosen.append(shard)
        mine[shard] += 1
        load[shard] += 1
    return tuple(chosen)


def dead_replicas(shards: Iterable[ShardRecord],
                  live_nodes: Iterable[str]) -> list[tuple[int, str]]:
    """(shard id, node id) of every replica whose node is not live, in a stable order."""
    live = set(live_nodes)
    return sorted((shard.shard_id, node) for shard in shards
                  for node in shard.replicas if node not in live)


def choose_replacement(shard: ShardRecord, dead_node: str, live_nodes: Iterable[str],
                       shards: Iterable[ShardRecord],
                       hosts: Mapping[str, str] | None = None) -> str:
    """The live node to take over ``dead_node``'s replica of ``shard``: one that holds no
    replica of this shard yet, on a host where none of the others is (``hosts`` as for
    ``place_replicas``), the least loaded first."""
    if dead_node not in shard.replicas:
        raise PlacementError(f"{dead_node} is not a replica of shard {shard.shard_id}")
    load = replica_load(shards)
    taken = {_host(hosts, n) for n in shard.replicas if n != dead_node}
    candidates = sorted((n for n in set(live_nodes)
                         if n not in shard.replicas and _host(hosts, n) not in taken),
                        key=lambda n: (load[n], n))
    if not candidates:
        raise PlacementError(f"no live node outside shard {shard.shard_id}'s replicas "
                             f"{shard.replicas} can replace {dead_node}")
    return candidates[0]


def replace_replica(shard: ShardRecord, dead_node: str, new_node: str) -> ShardRecord:
    """The shard's next record: ``new_node`` in ``dead_node``'s place, epoch + 1."""
    if new_node in shard.replicas:
        raise PlacementError(f"{new_node} already holds a replica of shard {shard.shard_id}")
    return shard.with_replicas(tuple(new_node if n == dead_node else n
                                     for n in shard.replicas))
