"""Named scenarios: a fault mix (the nemesis), a network, a workload. ``random`` mixes every
fault; each of the nine findings that made sqsq write its own Raft has a scenario aimed at
its path, and a mutant (the safeguard switched off) that the checker must catch there.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sqsq.raft import ConfChange, ConfOp, Safeguards
from sqsq.sim.disk import DiskSafeguards
from sqsq.sim.network import NetworkFaults
from sqsq.sim.rejoin import Rejoin
from sqsq.sim.staleack import StaleAck

if TYPE_CHECKING:
    from sqsq.sim.replica import SimReplica
    from sqsq.sim.world import World

FAULTS = ("crash", "crash-leader", "partition", "isolate-leader", "leader-minority", "one-way",
          "bridge", "late",
          "clock-step", "drift", "transfer", "reconfigure")


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: int = 3
    clients: int = 3
    duration_ms: int = 60_000
    faults: tuple[str, ...] = FAULTS
    fault_every_ms: tuple[int, int] = (300, 2500)
    heal_after_ms: tuple[int, int] = (200, 3000)
    drop: float = 0.02
    duplicate: float = 0.02
    slow: float = 0.02
    slow_ms: tuple[int, int] = (50, 1500)
    chances: dict[str, float] = field(default_factory=lambda: {
        "before-sync": 0.002, "mid-compaction": 0.02, "install-fails": 0.05,
        "mid-install": 0.05, "false-refusal": 0.0005})
    torn: float = 0.5
    compact_every: int = 30
    compact_keep: int = 10  # entries kept behind a snapshot, for followers a little behind
    max_inflight: int = 8
    max_append_bytes: int = 64 << 10
    pre_vote: bool = True
    big_bodies: float = 0.0  # chance a send carries a 100 KB - 1 MiB body
    think_ms: tuple[int, int] = (1, 30)  # a client's pause between two calls
    disk_ms: tuple[int, int] = (0, 3)  # how long persisting a Ready takes
    quiesce_after_ticks: int = 20
    # A scripted nemesis (``start()``s one schedule after another) in place of the random one
    script: Callable[[World], Any] | None = None
    description: str = ""

    def network(self) -> NetworkFaults:
        return NetworkFaults(drop=self.drop, duplicate=self.duplicate, slow=self.slow,
                             slow_ms=self.slow_ms)

    def calm_network(self) -> NetworkFaults:
        return NetworkFaults()

    def body_bytes(self, rng: random.Random) -> int:
        if self.big_bodies and rng.random() < self.big_bodies:
            return rng.randint(100_000, 1_000_000)
        return rng.randint(1, 64)

    def begin(self, world: World) -> None:
        if self.script is not None:
            self.script(world).start()
        else:
            Nemesis(world, self).schedule()


class Nemesis:
    """Injects the scenario's faults at random times, and heals each one later."""

    def __init__(self, world: World, scenario: Scenario) -> None:
        self.world = world
        self.s = scenario
        self.rng = world.rng

    def schedule(self) -> None:
        if self.s.faults:
            self.world.after(self.rng.randint(*self.s.fault_every_ms), self._strike)

    def _leader(self) -> str:
        for n, r in self.world.replicas.items():
            if r.core is not None and r.core.is_leader():
                return n
        return self.rng.choice(self.world.node_ids)

    def _strike(self, _: object) -> None:
        w = self.world
        if w.calm:
            return
        kind = self.rng.choice(self.s.faults)
        nodes = w.node_ids
        heal_in = self.rng.randint(*self.s.heal_after_ms)
        if kind in ("crash", "crash-leader"):
            target = self._leader() if kind == "crash-leader" else self.rng.choice(nodes)
            replica = w.replicas[target]
            if replica.up:
                replica.crash(torn=self.rng.random() < self.s.torn)
                w.after(heal_in, lambda _: w._restart(replica))
        elif kind in ("partition", "isolate-leader"):
            alone = self._leader() if kind == "isolate-leader" else self.rng.choice(nodes)
            others = set(nodes) - {alone}
            w.network.isolate([{alone}, others])
            w.after(heal_in, lambda _: w.network.heal())
        elif kind == "leader-minority":
            # the leader with one follower, cut off from a majority (five nodes and more):
            # what it appends there, and what that follower acknowledges, is never committed
            leader = self._leader()
            side = {leader, self.rng.choice(sorted(set(nodes) - {leader}))}
            w.network.isolate([side, set(nodes) - side])
            w.after(heal_in, lambda _: w.network.heal())
        elif kind == "one-way":
            a = self.rng.choice(nodes)
            w.network.one_way({a}, set(nodes) - {a})
            w.after(heal_in, lambda _: w.network.heal())
        elif kind == "late":
            # A link's packets stuck for a while (a full queue, a paused process), then some
            # of them delivered at once, in order, long after they were sent.
            a, b = self.rng.sample(nodes, 2)
            name = f"late-{a}-{b}-{w.now_ms}"
            w.network.hold(name, lambda frm, to, p: frm == a and to == b)

            def release(_: object) -> None:
                w.network.stop_holding(name)
                keep = self.rng.random()
                w.network.release(lambda frm, to, p: frm == a and to == b
                                  and self.rng.random() < keep)
                w.network.lose(lambda frm, to, p: frm == a and to == b)  # the rest lost
            w.after(heal_in, release)
        elif kind == "bridge" and len(nodes) >= 3:
            shuffled = self.rng.sample(nodes, len(nodes))
            middle, rest = shuffled[0], shuffled[1:]
            half = len(rest) // 2
            w.network.bridge(set(rest[:half]), middle, set(rest[half:]))
            w.after(heal_in, lambda _: w.network.heal())
        elif kind == "transfer":
            leader = w.replicas[self._leader()]
            if leader.core is not None and leader.core.is_leader():
                others = sorted(leader.core.voters() - {leader.id})
                if others:
                    leader.core.transfer_leadership(self.rng.choice(others))
                    leader.process()
        elif kind == "reconfigure":
            self._reconfigure()
        elif kind == "clock-step":
            r = w.replicas[self.rng.choice(nodes)]
            r.clock_offset_ms += self.rng.choice([-3_600_000, -5_000, 5_000, 60_000])
        elif kind == "drift":
            r = w.replicas[self.rng.choice(nodes)]
            r.drift = self.rng.choice([0.0, -0.3, 0.3, 1.0])
        self.schedule()

    def _reconfigure(self) -> None:
        """One membership step: promote a caught-up learner, retire a removed replica, or
        change the group by one server (remove a voter down to three, else add a learner)."""
        w = self.world
        leader = w.replicas[self._leader()]
        core = leader.core
        if core is None or not core.is_leader():
            return
        conf = core.log.conf()
        committed = core.log.last_conf_index() <= core.log.commit
        for node_id in list(w.node_ids):
            if committed and node_id not in conf.members() and node_id != leader.id:
                w.retire(node_id)
        changes = []
        if conf.learners and len(conf.voters) <= 3 and self.rng.random() < 0.5:
            self._replace(leader, sorted(conf.learners), sorted(conf.voters - {leader.id}))
            return
        if conf.learners:
            changes.append(ConfChange(ConfOp.PROMOTE, self.rng.choice(sorted(conf.learners))))
        if len(conf.voters) > 3:
            victim = self.rng.choice(sorted(conf.voters - {leader.id}))
            changes.append(ConfChange(ConfOp.REMOVE, victim))
        if not changes:
            changes.append(ConfChange(ConfOp.ADD_LEARNER, w.join().id))
        # Back to back: the second is refused while the first is uncommitted (finding 3).
        for change in self.rng.sample(changes, len(changes)):
            core.propose_conf_change(change)
        leader.process()

    def _replace(self, leader: SimReplica, learners: list[str], voters: list[str]) -> None:
        """A replacement as an operator makes one: a caught-up learner promoted and a voter
        removed back to back, and the leader with the new voter cut off from the rest at
        once. Without the one-change rule (finding 3) both changes are in force on the
        leader's side, where {leader, new voter} is a majority of the new group, while the
        rest are a majority of the old one: two leaders, two entries at one index."""
        w, core = self.world, leader.core
        assert core is not None
        new = self.rng.choice(learners)
        if core.propose_conf_change(ConfChange(ConfOp.PROMOTE, new)) is None:
            return  # not caught up yet
        core.propose_conf_change(ConfChange(ConfOp.REMOVE, self.rng.choice(voters)))
        leader.process()
        side = {leader.id, new}
        w.network.isolate([side, set(w.node_ids) - side])
        w.after(self.rng.randint(*self.s.heal_after_ms), lambda _: w.network.heal())


RANDOM = Scenario("random", description="every fault, mixed")
# Clients that pause for seconds: the group goes quiet between calls and must wake for each
# call, and elect a new leader when the quiet one is gone.
IDLE = Scenario("idle", clients=2, think_ms=(300, 4000),
                description="an idle group going quiet and waking, under every fault")

# One scenario per finding; the mutant names the safeguard the scenario exists to prove.
FINDINGS: dict[str, tuple[Scenario, str]] = {
    "compaction-crash": (Scenario(
        "compaction-crash", faults=("crash", "crash-leader", "partition"), compact_every=8,
        compact_keep=20, chances={"mid-compaction": 0.3},
        description="finding 1: a crash in the middle of compaction"), "segment_compaction"),
    "big-entry-repeat": (Scenario(
        "big-entry-repeat", faults=("crash-leader", "isolate-leader", "partition"),
        duplicate=0.5, slow=0.5, slow_ms=(20, 400), big_bodies=0.1, drop=0.05,
        max_append_bytes=1 << 20, fault_every_ms=(200, 1200),
        description="finding 2: old appends of large entries repeated to a follower"),
        "truncate_only_at_conflict"),
    "stale-ack": (Scenario(
        "stale-ack", nodes=5, faults=(), drop=0.0, duplicate=0.0, slow=0.0, chances={},
        script=StaleAck,
        description="finding 4: an acknowledgement from an old term arrives after its "
                    "leader lost those entries and leads again (sqsq.sim.staleack)"),
        "stale_responses_ignored"),
    "membership": (Scenario(
        "membership", faults=("reconfigure", "reconfigure", "reconfigure", "transfer",
                              "crash", "crash-leader", "partition", "isolate-leader"),
        fault_every_ms=(100, 800),
        description="finding 3: servers added, promoted and removed under faults"),
        "one_conf_change_at_a_time"),
    "failed-install": (Scenario(
        "failed-install", faults=("crash", "partition"), compact_every=5,
        chances={"install-fails": 0.5},
        description="finding 5: a snapshot install that fails"), "failed_install_stops"),
    "vote-amnesia": (Scenario(
        "vote-amnesia", faults=("crash", "crash-leader"), fault_every_ms=(50, 400),
        heal_after_ms=(10, 200), chances={"before-sync": 0.01}, pre_vote=False,
        description="finding 6: term and vote lost by a crash"), "durable_hard_state"),
    "torn-tail": (Scenario(
        "torn-tail", faults=("crash", "crash-leader"), torn=1.0,
        chances={"before-sync": 0.02},
        description="finding 6: a torn last record read back"), "checksums"),
    "install-crash": (Scenario(
        "install-crash", faults=("crash", "partition"), compact_every=5,
        chances={"mid-install": 0.5},
        description="finding 7: a crash in the middle of a snapshot install"),
        "staged_snapshot_install"),
    # The mutant is the scenario's own switch: pre-vote and check-quorum (``World``) off.
    "rejoin": (Scenario(
        "rejoin", faults=(), drop=0.0, duplicate=0.0, slow=0.0, chances={}, script=Rejoin,
        description="finding 8: a follower cut off for a while, then back (sqsq.sim.rejoin)"),
        "pre_vote"),
    "old-snapshot": (Scenario(
        "old-snapshot", faults=("partition", "crash"), compact_every=3, compact_keep=0,
        duplicate=0.5, slow=0.5, slow_ms=(200, 3000),
        description="finding 9: an old snapshot arrives after newer entries"),
        "refuse_snapshot_behind_commit"),
}

SCENARIOS: dict[str, Scenario] = {"random": RANDOM, "idle": IDLE} | {
    k: v[0] for k, v in FINDINGS.items()}


def mutant(name: str, scenario: Scenario) -> tuple[Safeguards, DiskSafeguards, Scenario]:
    """The safeguards, and ``scenario``, with the one called ``name`` switched off (a
    scenario's ``pre_vote`` also switches check-quorum off)."""
    raft, disk = Safeguards(), DiskSafeguards()
    if name == "pre_vote":
        return raft, disk, replace(scenario, pre_vote=False)
    if hasattr(raft, name):
        return replace(raft, **{name: False}), disk, scenario
    if hasattr(disk, name):
        return raft, replace(disk, **{name: False}), scenario
    raise KeyError(f"no safeguard called {name}")
