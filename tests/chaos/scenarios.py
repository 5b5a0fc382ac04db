"""The chaos scenarios: each injects one kind of fault, over and over, until its time is up.

A scenario is a function ``(cluster, rng, until) -> faults injected``. It waits a little
between faults so the load runs on a healthy cluster too, holds each fault for a while, and
undoes it before the next; the runner calls ``recover`` at the end whatever happened.
Times are seconds of the monotonic clock. Which node or shard a fault hits is drawn from
``rng``, so a run replays from its seed (up to the timing of real processes).
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chaos import clockprobe
from chaos.faults import ChaosCluster
from chaos.statefaults import (
    BIG_MAX,
    COMPACT_EVERY,
    FILL_MIB,
    SLOW_LINK,
    kill_compacting,
    replace_slow_catch_up,
    snapshot_install_leader_killed,
)
from chaos.steps import leader_of, wait
from sqsq.shard.clock import MAX_RATE_SKEW

HOUR_MS = 3_600_000

Fault = Callable[[ChaosCluster, random.Random], bool]  # whether a fault was injected


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    inject: Callable[[ChaosCluster, random.Random, float], int]
    driver_args: tuple[str, ...] = ()  # the load's own options (big bodies)


def _repeat(fault: Fault, *, gap_s: float,
            hold_s: float, heal: Callable[[ChaosCluster], None]
            ) -> Callable[[ChaosCluster, random.Random, float], int]:
    """A scenario that injects ``fault`` every ``gap_s``, holds it ``hold_s``, heals."""
    def inject(cc: ChaosCluster, rng: random.Random, until: float) -> int:
        faults = 0
        while wait(gap_s, until):
            if fault(cc, rng):
                faults += 1
                time.sleep(hold_s)  # the fault lasts: real processes, real time
            heal(cc)
        return faults
    return inject


def _on_leader(act: Callable[[ChaosCluster, str], None]) -> Fault:
    """A fault that does ``act`` to a shard's leader (none: no fault this time)."""
    def fault(cc: ChaosCluster, rng: random.Random) -> bool:
        found = leader_of(cc, rng)
        if found:
            act(cc, found[1])
        return bool(found)
    return fault


def _on_follower(act: Callable[[ChaosCluster, str], None]) -> Fault:
    """A fault that does ``act`` to a follower of a shard that has a leader."""
    def fault(cc: ChaosCluster, rng: random.Random) -> bool:
        found = leader_of(cc, rng)
        if found:
            act(cc, rng.choice([n for n in cc.replicas(found[0]) if n != found[1]]))
        return bool(found)
    return fault


def _kill_all(cc: ChaosCluster, rng: random.Random) -> bool:
    for node_id in cc.node_ids:
        cc.kill9(node_id)
    return True


def _isolate_leader(cc: ChaosCluster, rng: random.Random) -> bool:
    """The leader cut off from the other nodes; the gateway, etcd and clients still reach
    it (the case where a deposed leader must not acknowledge anything)."""
    found = leader_of(cc, rng)
    if found:
        cc.check()
        cc.net.isolate(found[1], [n for n in cc.node_ids if n != found[1]])
    return bool(found)


def _split_halves(cc: ChaosCluster, rng: random.Random) -> bool:
    """The nodes in two groups that cannot reach each other, a shard's leader in the smaller
    one; etcd, the gateway and the client stay with the larger."""
    found = leader_of(cc, rng)
    if not found:
        return False
    size = max(1, len(cc.node_ids) // 2)  # 3 nodes: 1 | 2; 4 nodes: 2 | 2
    small = [found[1], *rng.sample([n for n in cc.node_ids if n != found[1]], size - 1)]
    large = [n for n in cc.node_ids if n not in small]
    cc.check()
    for a in small:
        cc.net.isolate(a, [*large, *cc.etcd_hosts, "gateway", "client"])
    return True


def _one_way(cc: ChaosCluster, rng: random.Random) -> bool:
    """Packets from the leader to its followers are lost; theirs to it still arrive."""
    found = leader_of(cc, rng)
    if not found:
        return False
    for other in cc.node_ids:
        if other != found[1]:
            cc.net.cut_one_way(found[1], other)
    return True


def _kill_etcd(cc: ChaosCluster, rng: random.Random) -> bool:
    cc.kill_etcd()  # every member: no etcd at all
    return True


def _kill_etcd_member(cc: ChaosCluster, rng: random.Random) -> bool:
    cc.kill_etcd(rng.choice(cc.etcd_hosts))  # the two others keep a quorum
    return True


def _partition_any(cc: ChaosCluster, rng: random.Random) -> bool:
    return (_isolate_leader if rng.random() < 0.5 else _split_halves)(cc, rng)


def _kill_gateway(cc: ChaosCluster, rng: random.Random) -> bool:
    cc.kill_gateway()
    return True


def _clock_back(cc: ChaosCluster, rng: random.Random) -> bool:
    """A leader's wall clock stepped back an hour; a leader whose clock is already stepped
    is killed instead, so leadership moves between stepped and unstepped nodes."""
    found = leader_of(cc, rng)
    if not found:
        return False
    if found[1] in cc.stepped:
        cc.kill9(found[1])
    else:
        cc.step_clock(found[1], -HOUR_MS)
    return True


def _clock_forward(cc: ChaosCluster, rng: random.Random) -> bool:
    """A follower's wall clock stepped an hour ahead and its leader killed, so the election
    may pick it; a leader already an hour ahead is killed, so leadership moves on."""
    found = leader_of(cc, rng)
    if not found:
        return False
    leader = found[1]
    if leader not in cc.stepped:
        sane = [n for n in cc.node_ids if n != leader and n not in cc.stepped]
        if sane:
            cc.step_clock(rng.choice(sane), HOUR_MS)
    cc.kill9(leader)
    return True


def _clock_forward_probed(cc: ChaosCluster, rng: random.Random, until: float) -> int:
    """``_clock_forward`` over and over while ``clockprobe`` watches a queue with 60 s
    retention, and for a retention's length after the last fault; what it finds that the
    clock rule forbids goes to ``cc.findings``, and so does a run in which no node an hour
    ahead ever led."""
    work = cc.root.parent
    out = work / f"clockprobe-{int(time.monotonic())}.json"
    tail_s = clockprobe.RETENTION_S + 15
    probe = cc.net.popen("client", [
        sys.executable, str(Path(clockprobe.__file__)), "--endpoint", cc.gateway_url,
        "--queue", f"clock-probe-{rng.randrange(10**6)}", "--out", str(out),
        "--seconds", str(max(0.0, until - time.monotonic()) + tail_s)],
        log=work / "clockprobe.log")
    faults = skewed_leaders = 0
    while wait(4, until):
        if _clock_forward(cc, rng):
            faults += 1
            time.sleep(3)
        cc.recover(reset_clocks=False)  # clocks stay ahead: leaders live with them
        skewed_leaders += sum(cc.leader(s) in cc.stepped for s in range(cc.shards))
    probe.wait(timeout=tail_s + 120)
    if probe.returncode != 0 or not out.exists():
        cc.findings.append(f"the clock probe failed (exit {probe.returncode})")
        return faults
    result = json.loads(out.read_text())
    cc.findings += clockprobe.check(result, rate=1 + MAX_RATE_SKEW)
    if not skewed_leaders:
        cc.findings.append("no node an hour ahead led a shard: nothing was tested")
    if not result["sends"]:
        cc.findings.append("the clock probe sent nothing")
    return faults


def _rolling_restarts(cc: ChaosCluster, rng: random.Random, until: float) -> int:
    """``sqsq cluster restart --rolling``'s restart, over and over: every node stopped with
    SIGTERM and started again in turn, leaders last, each caught up before the next (a
    fault per node restarted)."""
    restarts = 0
    while wait(2, until):
        cc.check()
        restarts += len(cc.c.rolling_restart())
    return restarts


def _heal_all(cc: ChaosCluster) -> None:
    cc.recover()


def _heal_clock(cc: ChaosCluster) -> None:
    """Clocks stay stepped until the scenario ends (the point is leaders living with one);
    only a killed node is brought back."""
    cc.recover(reset_clocks=False)


SCENARIOS = [
    Scenario("kill-leader", "kill -9 of a shard leader, restarted 3 s later",
             _repeat(_on_leader(ChaosCluster.kill9), gap_s=4, hold_s=3, heal=_heal_all)),
    Scenario("kill-follower", "kill -9 of a follower, restarted 3 s later",
             _repeat(_on_follower(ChaosCluster.kill9), gap_s=4, hold_s=3, heal=_heal_all)),
    Scenario("kill-all", "kill -9 of every node at once, all restarted",
             _repeat(_kill_all, gap_s=6, hold_s=1, heal=_heal_all)),
    Scenario("pause-leader", "SIGSTOP of a leader for 3 s (past the 1.2 s election timeout), "
             "then SIGCONT",
             _repeat(_on_leader(ChaosCluster.pause), gap_s=4, hold_s=3, heal=_heal_all)),
    Scenario("partition-leader", "the leader cut off from its followers for 10 s, clients "
             "still reaching it", _repeat(_isolate_leader, gap_s=4, hold_s=10, heal=_heal_all)),
    Scenario("partition-halves", "the nodes split in two, a leader in the smaller half, for "
             "10 s", _repeat(_split_halves, gap_s=4, hold_s=10, heal=_heal_all)),
    Scenario("partition-one-way", "packets from the leader to its followers lost for 10 s",
             _repeat(_one_way, gap_s=4, hold_s=10, heal=_heal_all)),
    Scenario("wipe-follower", "a follower's data directory wiped, the node restarted",
             _repeat(_on_follower(ChaosCluster.wipe), gap_s=5, hold_s=3, heal=_heal_all)),
    Scenario("kill-etcd", "every etcd member killed with -9 for 5 s, then restarted",
             _repeat(_kill_etcd, gap_s=4, hold_s=5, heal=_heal_all)),
    Scenario("kill-gateway", "the gateway killed with -9, restarted 1 s later",
             _repeat(_kill_gateway, gap_s=4, hold_s=1, heal=_heal_all)),
    Scenario("rolling-restart", "every node restarted in turn (SIGTERM, same data), leaders "
             "last, each caught up before the next, as `sqsq cluster restart --rolling` does",
             _rolling_restarts),
    Scenario("clock-back", "a leader's wall clock stepped back an hour (and kept so); a "
             "stepped leader is killed, so leadership moves",
             _repeat(_clock_back, gap_s=4, hold_s=3, heal=_heal_clock)),
    Scenario("clock-forward", "a follower's wall clock stepped an hour ahead and its leader "
             "killed, so it may lead; a queue with 60 s retention watched for early expiry "
             "and early redelivery",
             _clock_forward_probed),
    Scenario("kill-etcd-member", "one of the three etcd members killed with -9 for 5 s, then "
             "restarted", _repeat(_kill_etcd_member, gap_s=4, hold_s=5, heal=_heal_all)),
    Scenario("big-messages-partition", "bodies of 100 KB to 1 MiB (SQS's largest) under "
             "partitions: the leader isolated, or the nodes split in halves, for 6 s",
             _repeat(_partition_any, gap_s=3, hold_s=6, heal=_heal_all),
             driver_args=("--body-bytes", f"100000:{BIG_MAX}")),
    Scenario("kill-compaction", f"Raft logs compacted every {COMPACT_EVERY} entries, nodes "
             "(leaders and followers in turn) killed with -9 every 0.5-2 s and restarted",
             kill_compacting),
    Scenario("snapshot-install-leader-killed", "a follower wiped, or killed until the "
             f"leader's log (compacted every {COMPACT_EVERY} entries) has moved past it, is "
             f"restarted to install a snapshot ({FILL_MIB} MiB of state), and its leader is "
             "killed with -9 during the install", snapshot_install_leader_killed),
    Scenario("replace-slow-catch-up", f"a node killed for good and replaced by a new one "
             f"(the controller's --replace-after) behind a {SLOW_LINK} link, {FILL_MIB} MiB "
             "of state to catch up, cut off for 1 s now and then; then each old member killed "
             "in turn: the shard must keep a leader (3 voters)", replace_slow_catch_up),
]

BY_NAME = {s.name: s for s in SCENARIOS}
