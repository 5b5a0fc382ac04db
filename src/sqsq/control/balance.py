"""Spreading shard leaders over the nodes.

Elections put leaders wherever they happen to land: after a node dies and comes back, the
others lead every shard and the returning node leads none, so one or two nodes do all the
work (a leader proposes, fsyncs and answers; a follower only appends). Each node's agent
looks at the partition map's leader hints and, when it leads at least two shards more than a
live node holding a replica of one of them, hands that shard's leadership to that node's
replica (a Raft leadership transfer: the group has its new leader within a round trip, and a
call that arrives meanwhile is answered NotLeader naming it). So no node leads more than one
shard above another it could give one to.

The choice is a pure function of the map, so every node reaches the same view of who should
move; only the over-loaded node acts, one shard at a time, and looks again once the hints
have caught up.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqsq.control.partition_map import MapSnapshot


@dataclass(frozen=True)
class LeaderMove:
    shard_id: int
    to_node: str


def leaders_per_node(snapshot: MapSnapshot) -> dict[str, list[int]]:
    """The shards each live node leads, as its hints say (every live node listed)."""
    led: dict[str, list[int]] = {n: [] for n in snapshot.nodes}
    for shard_id in sorted(snapshot.shards):
        leader = snapshot.leader_hint(shard_id)
        if leader is not None:
            led[leader.node_id].append(shard_id)
    return led


def next_move(snapshot: MapSnapshot, me: str) -> LeaderMove | None:
    """The leadership ``me`` should hand over now, if any: while every shard has a live
    leader (not in the middle of an election or a replacement), a shard ``me`` leads goes to
    the live replica whose node leads fewest, if that is at least two fewer than ``me``."""
    led = leaders_per_node(snapshot)
    if me not in led or sum(map(len, led.values())) != len(snapshot.shards):
        return None
    mine = len(led[me])
    best: tuple[int, int, str] | None = None
    for shard_id in led[me]:
        for node in snapshot.shards[shard_id].replicas:
            if node == me or node not in led:
                continue
            candidate = (len(led[node]), shard_id, node)
            if candidate[0] <= mine - 2 and (best is None or candidate < best):
                best = candidate
    return None if best is None else LeaderMove(best[1], best[2])
