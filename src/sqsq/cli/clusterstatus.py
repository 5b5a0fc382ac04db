"""``sqsq cluster status``'s view: nodes, shards and queues as the partition map in etcd has
them (any host that reaches etcd can read it: no cluster directory needed)."""

from __future__ import annotations

import asyncio
from typing import Any

from sqsq.cli import rolling


def read_status(etcd_endpoint: str, *, replicas: bool = False) -> dict[str, Any]:
    """Nodes, shards and queues as the partition map in etcd has them; with ``replicas``,
    also each live node's replicas as the node reports them."""
    from sqsq.control.etcd import Etcd
    from sqsq.control.partition_map import MapSnapshot

    async def read() -> MapSnapshot:
        async with Etcd(etcd_endpoint, retry_for_s=3.0) as etcd:
            from sqsq.control import keys

            return MapSnapshot.from_range(await etcd.get_prefix(keys.ROOT))

    snapshot = asyncio.run(read())

    def hint(shard_id: int) -> dict[str, Any]:
        # The leader's hint, if its node is live; "applied_epoch": the replica set its Raft
        # membership has caught up with (less than "epoch" while a change is under way).
        leader = snapshot.leader_hint(shard_id)
        return {"leader": leader.node_id if leader else None,
                "applied_epoch": snapshot.leaders[shard_id].epoch if leader else None}

    from sqsq.control.balance import leaders_per_node
    from sqsq.wire import send_partition

    led = leaders_per_node(snapshot)
    nodes = [{"id": n, "alive": n in snapshot.nodes, "grpc": snapshot.members[n].grpc_address,
              "leads": led.get(n, []), "host": snapshot.members[n].host_label,
              "busy": n in snapshot.nodes and snapshot.nodes[n].busy}
             for n in sorted(snapshot.members)]

    def sends(name: str) -> list[int]:  # the partitions a standard queue's sends take now
        home, width = snapshot.send_partitions(name)
        count = len(snapshot.partitions(name))
        return [send_partition(turn, home, width, count) for turn in range(width)]

    return {
        "nodes": nodes,
        "shards": [{"id": s.shard_id, "epoch": s.epoch, "replicas": list(s.replicas),
                    **hint(s.shard_id)}
                   for s in sorted(snapshot.shards.values(), key=lambda s: s.shard_id)],
        "queues": [{"name": q.name, "partitions": list(q.partitions),
                    **({} if q.name.endswith(".fifo") else {"sends_to": sends(q.name)})}
                   for q in sorted(snapshot.queues.values(), key=lambda q: q.name)],
        **({"replicas": rolling.read_replicas(nodes)} if replicas else {}),
    }
