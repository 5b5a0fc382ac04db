"""What every chaos scenario does between faults: wait without overrunning its time, and
find a shard's leader to hit."""

from __future__ import annotations

import random
import time

from chaos.faults import ChaosCluster


def wait(seconds: float, until: float) -> bool:
    """Sleep ``seconds`` (real processes need real time), or less if ``until`` comes first;
    whether there is time left for another fault."""
    time.sleep(max(0.0, min(seconds, until - time.monotonic())))
    return time.monotonic() < until


def leader_of(cc: ChaosCluster, rng: random.Random) -> tuple[int, str] | None:
    shard = rng.randrange(cc.shards)
    leader = cc.leader(shard)
    return (shard, leader) if leader else None
