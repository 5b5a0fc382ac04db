"""The chaos scenarios about state: compaction made frequent, snapshots installed while the
leader dies, a replica replaced behind a slow link (``scenarios.SCENARIOS`` lists them).

State for a replica to catch up on comes from ``filler.py`` (a queue no checker reads, filled
and then purged); nodes get ``--compaction-entries`` through ``ChaosCluster.set_node_args``.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from chaos.faults import SPARE, ChaosCluster
from chaos.steps import leader_of, wait
from sqsq.shard.durable import TMP_SUFFIX

BIG_MAX = 1_048_576  # the largest message sqsq accepts (SQS's MaximumMessageSize, 1 MiB)
COMPACT_EVERY = 200  # --compaction-entries while a scenario wants compaction all the time
FILL_MIB = 16  # state put in a queue no checker reads, for a snapshot worth waiting for
SLOW_LINK = "4mbit"  # a 16 MiB snapshot takes about 30 s through it
FILLER = Path(__file__).with_name("filler.py")
REPLACE_TIMEOUT_S = 180.0
SNAPSHOT_WATCH_S = 3.0


def _fill(cc: ChaosCluster, *, purge: bool = False) -> None:
    """``FILL_MIB`` MiB into the filler queue (or, with ``purge``, none left)."""
    argv = [sys.executable, str(FILLER), "--endpoint", cc.gateway_url, "--queue",
            "chaos-filler", "--mib", str(FILL_MIB), *(["--purge"] if purge else [])]
    done = cc.net.run("client", argv, timeout=300)
    if done.returncode != 0:
        cc.findings.append(f"the filler failed: {(done.stdout + done.stderr)[-500:]}")


def kill_compacting(cc: ChaosCluster, rng: random.Random, until: float) -> int:
    """kill -9 over and over, each restart with compaction every ``COMPACT_EVERY`` entries
    (so after the first round every node compacts every few seconds under the load): a
    leader, then a follower, each back 0.2-1 s later, 0.5-2 s between kills. A kill waits
    up to ``SNAPSHOT_WATCH_S`` for the node to be writing a snapshot (its temp file in a
    replica's snapshots directory) and strikes then if it sees one. Only one node is down
    at a time. Nodes restarted here keep compacting often until their next restart (a later
    scenario's)."""
    cc.set_node_args("--compaction-entries", str(COMPACT_EVERY))
    faults = mid_snapshot = 0
    try:
        while wait(rng.uniform(0.5, 2.0), until):
            found = leader_of(cc, rng)
            if not found:
                cc.recover()
                continue
            shard, leader = found
            victim = leader if faults % 2 == 0 else rng.choice(
                [n for n in cc.replicas(shard) if n != leader])
            watch = time.monotonic() + SNAPSHOT_WATCH_S
            while time.monotonic() < watch and not _snapshotting(cc, victim):
                time.sleep(0.005)
            mid_snapshot += time.monotonic() < watch
            cc.kill9(victim)
            faults += 1
            time.sleep(rng.uniform(0.2, 1.0))
            cc.start(victim)
    finally:
        cc.set_node_args()
    print(f"kill-compaction: {mid_snapshot} of {faults} kills while a snapshot was being "
          "written", flush=True)
    return faults


def _snapshotting(cc: ChaosCluster, node_id: str) -> bool:
    """Whether ``node_id`` is writing a snapshot of one of its replicas (a temp file)."""
    return any(cc.node(node_id).root.glob(f"shard-*/raft/snapshots/*{TMP_SUFFIX}"))


def _installing(cc: ChaosCluster, node_id: str) -> bool:
    """Whether a snapshot from the leader is arriving at ``node_id`` (files in its replica's
    incoming-snapshots directory)."""
    return any(p.is_file() for p in cc.node(node_id).root.glob("**/incoming-snapshots/*"))


def snapshot_install_leader_killed(cc: ChaosCluster, rng: random.Random,
                                    until: float) -> int:
    """Every node restarted (gracefully) to compact every ``COMPACT_EVERY`` entries, state
    put in; then over and over: a follower of a shard is wiped, or killed until the leader
    has compacted past it, and started again, so the leader sends it a snapshot; the leader
    is killed with -9 as soon as the snapshot is seen arriving (or 3 s after the restart),
    and started again 2 s later."""
    cc.set_node_args("--compaction-entries", str(COMPACT_EVERY))
    faults = mid_install = round_ = 0
    try:
        cc.c.rolling_restart()
        _fill(cc)
        while wait(2, until):
            found = leader_of(cc, rng)
            if not found:
                cc.recover()
                continue
            shard, leader = found
            follower = rng.choice([n for n in cc.replicas(shard) if n != leader])
            if round_ % 2 == 0:
                cc.wipe(follower)
            else:
                cc.kill9(follower)
                time.sleep(8)  # a few hundred entries: past the leader's last compaction
                cc.start(follower)
            round_ += 1
            faults += 1
            seen = time.monotonic() + 3
            while time.monotonic() < seen and not _installing(cc, follower):
                time.sleep(0.01)
            mid_install += time.monotonic() < seen
            if cc.node(leader).alive:
                cc.kill9(leader)
                faults += 1
            time.sleep(2)
            cc.recover()
        _fill(cc, purge=True)
    finally:
        cc.set_node_args()
    print(f"snapshot-install-leader-killed: {round_} followers restarted, {mid_install} "
          "leaders killed while a snapshot arrived", flush=True)
    return faults


def _replaced(cc: ChaosCluster, victim: str, new: str) -> bool:
    """Every shard's record has ``new`` in place of ``victim``, and a live leader has
    published a hint at the record's epoch (its membership caught up, as far as it says)."""
    status = cc.status()
    return status is not None and all(
        victim not in s["replicas"] and new in s["replicas"] and s["leader"]
        and s["applied_epoch"] == s["epoch"] for s in status["shards"])


def _caught_up(cc: ChaosCluster, node_id: str, slack: int = 50) -> bool:
    """Every replica of ``node_id`` has applied all but ``slack`` entries of what its
    shard's leader had committed (each node's own report, ``cluster status --replicas``)."""
    try:
        reps = cc.c.status(replicas=True)["replicas"]
    except Exception:  # noqa: BLE001 - etcd or a node busy: not yet
        return False
    mine = {r["shard"]: r["applied"] for r in reps.get(node_id, [])}
    led = {r["shard"]: r["commit"] for rs in reps.values() for r in rs if r["leader"]}
    return len(mine) == cc.shards and all(
        s in led and mine[s] >= led[s] - slack for s in range(cc.shards))


def _led(cc: ChaosCluster) -> set[int]:
    """The shards some live node says it leads (its own report, not the hint in etcd,
    which a leader that stepped down leaves behind while its lease lives)."""
    try:
        reps = cc.c.status(replicas=True)["replicas"]
    except Exception:  # noqa: BLE001 - etcd or a node busy: none known
        return set()
    return {r["shard"] for rs in reps.values() for r in rs if r["leader"]}


def replace_slow_catch_up(cc: ChaosCluster, rng: random.Random, until: float) -> int:
    """State put in, a new node started on the spare host behind a ``SLOW_LINK`` link, a
    node killed for good: after --replace-after the controller gives its replicas to the
    new node, which catches up through the slow link, cut off for 1 s now and then. Once
    the map says the replacement is done and the new node has caught up, the link is
    freed and each of the two old live members is killed in turn: with three voters every
    shard elects a leader without it; with the new replica still a learner it cannot.
    Runs once per cluster (the spare stays a member)."""
    if SPARE in cc.node_ids:
        cc.findings.append("the spare already joined: replace-slow-catch-up runs once a run")
        return 0
    _fill(cc)
    cc.net.throttle(SPARE, SLOW_LINK)
    new = cc.add_spare()
    victim = rng.choice([n for n in cc.node_ids if n != new])
    cc.kill9(victim)
    faults, began = 1, time.monotonic()
    replaced: float | None = None
    while replaced is None or not _caught_up(cc, new):
        if replaced is None and _replaced(cc, victim, new):
            replaced = time.monotonic()
        if time.monotonic() - began > REPLACE_TIMEOUT_S:
            cc.findings.append(f"{victim} was not replaced by {new}, caught up, within "
                               f"{REPLACE_TIMEOUT_S:.0f} s: {cc.status()}")
            break
        time.sleep(2)
        if rng.random() < 0.4:
            cc.net.isolate(new)
            faults += 1
            time.sleep(1)
            cc.net.heal(throttles=False)
    print(f"replace-slow-catch-up: {victim} replaced by {new} in the map after "
          f"{(replaced or began) - began:.1f} s, caught up after "
          f"{time.monotonic() - began:.1f} s", flush=True)
    cc.net.unthrottle(new)
    time.sleep(2)  # its leaders see it caught up and give it its vote
    for old in [n for n in cc.node_ids if n not in (victim, new)]:
        cc.kill9(old)
        faults += 1
        deadline = time.monotonic() + 15
        while _led(cc) != set(range(cc.shards)):
            if time.monotonic() > deadline:
                cc.findings.append(f"with {old} down (and {victim} replaced by {new}) a shard "
                                   f"had no leader for 15 s: the new replica does not vote? "
                                   f"{cc.status()}")
                break
            time.sleep(0.5)
        cc.start(old)
        cc.wait_ready()
    _fill(cc, purge=True)
    return faults
