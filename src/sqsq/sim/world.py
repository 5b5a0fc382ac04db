"""The simulated world: one seeded scheduler over replicas, clients, a network, disks and
clocks. Everything that happens comes from one ``random.Random(seed)``, so a seed replays
the same run, step for step.

A run has two phases: faults (the scenario's nemesis crashes nodes, cuts links, steps clocks)
while clients work, then calm (everything healed and restarted, clients stopped) until the
replicas agree; then the checker's final pass.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqsq.raft import RaftConfig, Safeguards
from sqsq.sim.checker import Checker, Violation
from sqsq.sim.clients import SimClient
from sqsq.sim.disk import DiskSafeguards, SimDisk
from sqsq.sim.network import SimNetwork
from sqsq.sim.replica import TICK_MS, SimReplica
from sqsq.sim.scenarios import Scenario

ALL_ON, DISK_ALL_ON = Safeguards(), DiskSafeguards()


@dataclass
class RunResult:
    seed: int
    scenario: str
    steps: int
    sim_ms: int
    violations: list[Violation]
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


class World:
    def __init__(self, seed: int, scenario: Scenario, *,
                 safeguards: Safeguards = ALL_ON,
                 disk_safeguards: DiskSafeguards = DISK_ALL_ON) -> None:
        self.seed = seed
        self.scenario = scenario
        self.rng = random.Random(seed)
        self.now_ms = 0
        self._queue: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self.steps = 0
        self.ready = False  # the queues exist: clients may start their work
        self.calm = False
        self.checker = Checker()
        self.notes: dict[str, int] = {}  # counts a scenario's nemesis keeps (in the stats)
        self.network = SimNetwork(self.rng, self._schedule_packet, scenario.network())
        self.node_ids = [f"n{i + 1}" for i in range(scenario.nodes)]  # members, not retired
        self._safeguards, self._disk_safeguards = safeguards, disk_safeguards
        self.raft_config = RaftConfig(election_ticks=10, heartbeat_ticks=2,
                                      max_inflight=scenario.max_inflight,
                                      max_append_bytes=scenario.max_append_bytes,
                                      pre_vote=scenario.pre_vote,
                                      check_quorum=scenario.pre_vote,
                                      quiesce_after_ticks=scenario.quiesce_after_ticks)
        self.replicas: dict[str, SimReplica] = {}
        voters = frozenset(self.node_ids)
        for n in self.node_ids:
            self._new_replica(n, SimDisk.bootstrapped(voters, disk_safeguards))
        self.clients = {name: SimClient(self, name, setup=(i == 0))
                        for i, name in enumerate(f"c{i + 1}" for i in range(scenario.clients))}

    def _new_replica(self, node_id: str, disk: SimDisk) -> SimReplica:
        replica = SimReplica(self, node_id, disk, self.raft_config, self._safeguards)
        self.replicas[node_id] = replica
        return replica

    def join(self) -> SimReplica:
        """A new, empty replica under a new name (a wiped replica never rejoins as itself):
        it knows no members until the leader's log or snapshot tells it."""
        node_id = f"n{len(self.replicas) + 1}"
        replica = self._new_replica(node_id, SimDisk(self._disk_safeguards))
        self.node_ids.append(node_id)
        replica.start()
        return replica

    def retire(self, node_id: str) -> None:
        """A replica removed from the group is stopped for good."""
        replica = self.replicas[node_id]
        replica.crash()
        replica.retired = True
        if node_id in self.node_ids:
            self.node_ids.remove(node_id)

    def sole_leader(self, among: list[str] | None = None) -> SimReplica | None:
        """The replica (of the nodes ``among``) that is up and leads, if exactly one does."""
        found = [r for n, r in self.replicas.items() if (among is None or n in among)
                 and r.core is not None and r.core.is_leader()]
        return found[0] if len(found) == 1 else None

    def steady_leader(self) -> SimReplica | None:
        """The sole leader, while the queues exist and every member is up (when a scripted
        nemesis may begin its schedule); None otherwise."""
        if not self.ready or any(not self.replicas[n].up for n in self.node_ids):
            return None
        return self.sole_leader()

    # ---- scheduling -------------------------------------------------------------------------

    def after(self, delay_ms: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now_ms + delay_ms, self._seq, fn, arg))

    def _schedule_packet(self, delay_ms: int, deliver: Callable[[Any], None], packet: Any
                         ) -> None:
        self.after(delay_ms, deliver, packet)

    def send(self, frm: str, to: str, packet: object) -> None:
        self.network.send(frm, to, packet, self.replicas[to].receive)

    def send_to_node(self, client: str, node: str, packet: object) -> None:
        self.network.send(client, node, packet, self.replicas[node].receive)

    def send_to_client(self, node: str, client: str, packet: object) -> None:
        self.network.send(node, client, packet, self.clients[client].on_reply)

    # ---- faults the hosts ask about ---------------------------------------------------------

    def chance(self, what: str) -> bool:
        p = 0.0 if self.calm else self.scenario.chances.get(what, 0.0)
        return p > 0 and self.rng.random() < p

    def crash_point(self, replica: SimReplica, stage: str) -> bool:
        if self.chance(stage):
            replica.crash(torn=self.rng.random() < self.scenario.torn)
            self._restart_later(replica)
            return True
        return False

    def cut_compaction(self, replica: SimReplica) -> int | None:
        if self.chance("mid-compaction"):
            self._restart_later(replica)
            return self.rng.randint(0, 5)
        return None

    def refusing(self, node_id: str) -> None:
        """A crashed node's connections close and its port refuses new ones: each node that
        can still reach it learns so a moment later, when it dials again."""
        for other in self.node_ids:
            if other != node_id and (other, node_id) not in self.network.cut:
                self.after(self.rng.randint(1, 10), self.replicas[other].refused_by, node_id)

    def _restart_later(self, replica: SimReplica) -> None:
        self.after(self.rng.randint(50, 1500), lambda _: self._restart(replica))

    def _restart(self, replica: SimReplica) -> None:
        if not replica.up and not replica.unrecoverable and not replica.retired:
            replica.start()
            replica.process()

    # ---- running ----------------------------------------------------------------------------

    def run(self, max_steps: int) -> RunResult:
        for r in self.replicas.values():
            r.start()
        for client in self.clients.values():
            client.start()
        self.scenario.begin(self)
        fault_steps = int(max_steps * 0.85)
        self._loop(fault_steps, self.scenario.duration_ms)
        self._settle(max_steps)
        return RunResult(self.seed, self.scenario.name, self.steps, self.now_ms,
                         self.checker.violations, self._stats())

    def _loop(self, max_steps: int, until_ms: int | None = None,
              done: Callable[[], bool] | None = None) -> None:
        q = self._queue
        while q and self.steps < max_steps:
            if until_ms is not None and q[0][0] > until_ms:
                break
            t, _, fn, arg = heapq.heappop(q)
            self.now_ms = t
            self.steps += 1
            fn(arg)
            if done is not None and self.steps % 64 == 0 and done():
                return

    def _settle(self, max_steps: int) -> None:
        self.calm = True
        self.network.heal()
        self.network.faults = self.scenario.calm_network()
        for r in self.replicas.values():
            r.drift = 0.0
            self._restart(r)
        self._loop(self.steps + 20_000, self.now_ms + 3_000)  # let clients finish in calm
        for client in self.clients.values():
            client.stopped = True
        self._loop(self.steps + 200_000, self.now_ms + 30_000, self._agreed)
        agreed = self._agreed()
        up = {n: r for n, r in self.replicas.items() if r.up}
        if not agreed:
            lagging = {n: r.machine.applied for n, r in up.items()}
            self.checker.violation("no-progress", f"replicas did not converge: {lagging}")
        self.checker.final({n: r.machine for n, r in up.items()})

    def _agreed(self) -> bool:
        up = [r for r in self.replicas.values() if r.up]
        leaders = [r for r in up if r.core is not None and r.core.is_leader()]
        if len(leaders) != 1:
            return False
        log = leaders[0].core.log  # type: ignore[union-attr]
        if log.last_conf_index() > log.commit:
            return False  # a membership change is still in flight
        members = log.conf().members()
        for r in list(up):
            if r.id not in members:
                self.retire(r.id)  # removed from the group: stopped for good
                up.remove(r)
        if any(not self.replicas[m].up for m in members if not self.replicas[m].unrecoverable):
            return False
        return all(r.machine.applied == log.commit for r in up)

    def _stats(self) -> dict[str, int]:
        return {"acks": self.checker.acks, "reads": self.checker.reads,
                "committed": self.checker.max_applied, "terms": len(self.checker.leaders),
                "packets": self.network.sent, "dropped": self.network.dropped,
                "replicas": len(self.replicas),
                "retired": sum(r.retired for r in self.replicas.values()),
                "written": self.checker.written,
                "prepared": sum(r.prepared_used for r in self.replicas.values()),
                **self.notes}


def ticks_ms(ticks: int) -> int:
    return ticks * TICK_MS
