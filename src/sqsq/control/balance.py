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

A node also says in its record whether its event loop is near full (``busy_after``): a
standard queue's sends stay on the queue's home partition, where every client's calls share
one shard's Raft entries, until the leader there is busy, and then take the next partitions
too (``sqsq.wire.send_width``). Spread over four shards all the time, one queue's calls made
four smaller group commits where one did, each paying its frames, syncs and applies: four
shards did 0.85-0.93x the messages a second of one on a two-core machine. Busy is a loop at
0.7 of a second: on two cores a leader's loop carrying a queue's batched calls ran at
0.75-0.84 (the machine a fifth idle, that one thread the limit), its single-message calls at
0.55-0.60 (there the whole machine is the limit, and a second leader only makes the entries
smaller); spread, the batched workloads did 0.97-1.26x one leader's in paired windows
(one shard against itself reads up to 1.03x there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sqsq.control.partition_map import MapSnapshot

# A node is busy once its event loop's thread spent this share of a second on the CPU, and
# calm again below CALM_BELOW: apart, so that the sends it sheds do not bring it back at once.
BUSY_AT = 0.7
CALM_BELOW = 0.45
ENV_BUSY_AT = "SQSQ_BUSY_AT"  # BUSY_AT for this node (0: always busy, sends always spread)


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


def busy_at() -> float:
    """The share of its loop's time at which this node says it is busy (``ENV_BUSY_AT``)."""
    text = os.environ.get(ENV_BUSY_AT, "").strip()
    if not text:
        return BUSY_AT
    value = float(text)
    if value < 0:
        raise ValueError(f"{ENV_BUSY_AT} must be 0 or more, not {text!r}")
    return value


def busy_after(was_busy: bool, loop_share: float, at: float = BUSY_AT) -> bool:
    """Whether a node is busy, from its event loop's share of the last second on the CPU:
    busy from ``at`` on, calm again below ``CALM_BELOW`` (or below ``at``, if lower)."""
    if loop_share >= at:
        return True
    return was_busy and loop_share >= min(CALM_BELOW, at)
