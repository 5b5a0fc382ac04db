"""A cluster in network namespaces and the faults the chaos scenarios inject into it.

``ChaosCluster`` puts each etcd member, every node, the gateway and the client on hosts of a
``Net`` (``netns.py``), starts them through ``LocalCluster`` (the code ``sqsq cluster up``
runs: three etcd members, as it starts for three nodes or more), and offers each fault as
one method: kill -9, SIGSTOP/SIGCONT, a wiped data directory, a stepped wall clock, network
cuts and a throttled link. A spare host waits unused until a scenario adds a node on it
(``add_spare``), which is then a member of the cluster for the rest of the run.
``recover`` undoes every fault (heal the network, resume and restart what is down, reset
clocks) and waits until every shard has a leader.
Every process is started and stopped by pid; the Net deletes its namespaces on close.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from chaos.netns import Net
from sqsq.cli.cluster import LocalCluster
from sqsq.cli.clusterdir import NodeProcess
from sqsq.cli.localprocs import free_port, free_port_range

CLOCK_FILE = "clock-offset-ms"  # in each node's data directory (see sqsq.shard.clock)
READY_S = 90.0
ETCD_MEMBERS = 3
SPARE = "n4"  # a host with no node until a scenario adds one (replacement needs a spare)
# With three nodes and three replicas a shard has no node to move to, so replacement cannot
# happen until the spare joins; then a node gone this long is replaced.
REPLACE_AFTER_S = 8.0


class ChaosCluster:
    def __init__(self, root: Path, *, nodes: int = 3, shards: int = 2,
                 partitions: int = 2) -> None:
        self.node_ids = [f"n{i + 1}" for i in range(nodes)]
        self.etcd_hosts = [f"etcd{i + 1}" for i in range(ETCD_MEMBERS)]
        self.net = Net([*self.etcd_hosts, *self.node_ids, SPARE, "gateway", "client"])
        self.root = root
        self.shards = shards
        self.partitions = partitions
        self.cluster: LocalCluster | None = None
        self.paused: set[str] = set()
        self.stepped: set[str] = set()
        self.findings: list[str] = []  # what a scenario's own checks found (clock-forward)

    # -- life --------------------------------------------------------------------------------

    def __enter__(self) -> ChaosCluster:
        self.net.open()
        try:
            env = dict(os.environ, SQSQ_LOG_LEVEL="WARNING", SQSQ_CLOCK_OFFSET_FILE=CLOCK_FILE)
            self.cluster = LocalCluster(
                self.root, nodes=len(self.node_ids), shards=self.shards,
                partitions=self.partitions, etcd_members=len(self.etcd_hosts), env=env,
                placement=self.net,
                node_args=("--replace-after", str(REPLACE_AFTER_S))).start()
        except BaseException:
            self.net.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.cluster is not None:
                for node in self.cluster.nodes:
                    if node.proc is not None and node.proc.poll() is None:
                        os.kill(node.proc.pid, signal.SIGCONT)
                self.cluster.stop()
        finally:
            self.net.close()

    @property
    def c(self) -> LocalCluster:
        assert self.cluster is not None
        return self.cluster

    @property
    def gateway_url(self) -> str:
        return self.c.gateway.http_url

    def node(self, node_id: str) -> NodeProcess:
        return next(n for n in self.c.nodes if n.node_id == node_id)

    # -- what the cluster says ---------------------------------------------------------------

    def status(self, attempts: int = 5) -> dict[str, Any] | None:
        """The partition map's view (None while etcd cannot be read)."""
        for _ in range(attempts):
            try:
                return self.c.status()
            except Exception:  # noqa: BLE001 - etcd down or mid-election: try again
                time.sleep(0.5)
        return None

    def leader(self, shard: int) -> str | None:
        """The node id the shard's leader hint names, if it is a node that is running."""
        status = self.status()
        if status is None:
            return None
        for s in status["shards"]:
            if s["id"] == shard and s["leader"] and self.node(s["leader"]).alive \
                    and s["leader"] not in self.paused:
                return s["leader"]
        return None

    def replicas(self, shard: int) -> list[str]:
        status = self.status()
        if status is None:
            return list(self.node_ids)
        return next((list(s["replicas"]) for s in status["shards"] if s["id"] == shard),
                    list(self.node_ids))

    # -- faults ------------------------------------------------------------------------------

    def check(self) -> None:
        self.net.check_isolation()  # before every fault, as the traffic rules require

    def kill9(self, node_id: str) -> None:
        self.check()
        self.c.kill9(self.node(node_id).proc)

    def start(self, node_id: str) -> None:
        node = self.node(node_id)
        if not node.alive:
            self.c.start_node(node)

    def pause(self, node_id: str) -> None:
        self.check()
        node = self.node(node_id)
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGSTOP)
        self.paused.add(node_id)

    def resume(self, node_id: str) -> None:
        node = self.node(node_id)
        if node.proc is not None and node.proc.poll() is None:
            os.kill(node.proc.pid, signal.SIGCONT)
        self.paused.discard(node_id)

    def wipe(self, node_id: str) -> None:
        """Kill the node, delete its data directory, start it again (it rejoins as new)."""
        self.kill9(node_id)
        node = self.node(node_id)
        shutil.rmtree(node.root, ignore_errors=True)
        self.c.start_node(node)

    def step_clock(self, node_id: str, offset_ms: int) -> None:
        self.check()
        path = self.node(node_id).root / CLOCK_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(offset_ms))
        os.replace(tmp, path)
        self.stepped.add(node_id)

    def kill_etcd(self, member: str | None = None) -> None:
        """kill -9 of one etcd member (by host name), or of every member."""
        self.check()
        for m in self.c.etcds:
            if member is None or self.c.etcd_name(m) == member:
                self.c.kill9(m.proc)

    def start_etcd(self) -> None:
        """Every member that is down, all launched before any is waited for: a member alone
        cannot serve while the others it needs for a quorum are down too."""
        down = [m for m in self.c.etcds if m.proc is None or m.proc.poll() is not None]
        for m in down:
            m.launch()
        for m in down:
            m.wait_serving()

    def set_node_args(self, *extra: str) -> None:
        """What a node started from now on is given besides the usual (a node already
        running keeps its own until it is restarted)."""
        self.c.node_args = ("--replace-after", str(REPLACE_AFTER_S), *extra)

    def add_spare(self) -> str:
        """A new node on the spare host, started, a cluster member from now on."""
        if SPARE in self.node_ids:
            return SPARE
        c = self.c
        node = NodeProcess(SPARE, c.root / SPARE, free_port(), free_port_range(self.shards),
                           host=self.net.ip(SPARE), host_label=SPARE)
        c.nodes.append(node)
        self.node_ids.append(SPARE)
        c.start_node(node)
        return SPARE

    def kill_gateway(self) -> None:
        self.check()
        self.c.kill9(self.c.gateway.proc)

    def start_gateway(self) -> None:
        g = self.c.gateway
        if g.proc is None or g.proc.poll() is not None:
            self.c.start_gateway()

    # -- recovery ----------------------------------------------------------------------------

    def recover(self, *, reset_clocks: bool = True) -> None:
        """Every fault undone (stepped clocks too, unless told not to); returns once every
        shard has a running leader."""
        self.net.heal()
        for node_id in list(self.paused):
            self.resume(node_id)
        if reset_clocks:
            for node_id in list(self.stepped):
                (self.node(node_id).root / CLOCK_FILE).write_text("0")
            self.stepped.clear()
        self.start_etcd()
        for node_id in self.node_ids:
            self.start(node_id)
        self.start_gateway()
        self.wait_ready()

    def wait_ready(self, timeout_s: float = READY_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self.leader(s) for s in range(self.shards)):
                return
            time.sleep(0.5)
        raise AssertionError(f"the cluster did not recover within {timeout_s}s: "
                             f"{self.status()}")
