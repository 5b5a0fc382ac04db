"""A whole cluster on this machine: ``LocalCluster``, what ``sqsq cluster up`` runs (the
commands are in ``sqsq.cli.clustercmd``).

    sqsq cluster up --nodes 3 --shards 4 --dir ./cluster      # etcd, 3 nodes, a gateway
    sqsq cluster status --dir ./cluster [--json]
    sqsq cluster start-node --dir ./cluster n2                # while `up` runs
    sqsq cluster restart --rolling --dir ./cluster            # while `up` runs

``up`` records the ports in ``DIR/cluster.json`` (``sqsq.cli.clusterdir``), starts etcd, the
nodes and a gateway as child processes listening on 127.0.0.1, waits until every shard has a
leader and the gateway answers, adds the pids to ``cluster.json``, and stays in the
foreground, supervising them (``sqsq.cli.supervisor``): Ctrl-C (or SIGTERM) stops them all,
by pid. Each process logs to ``DIR/logs/``. The tests start clusters through
``LocalCluster`` too.

A ``Placement`` puts each process somewhere else instead (the chaos tests: one network
namespace per process, so links between them can be cut); ``status`` is then read by
``sqsq cluster status --etcd`` run on the placement's "client" host
(``sqsq.cli.clusterstatus``).

``restart --rolling``: see ``sqsq.cli.rolling``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from sqsq import admincred
from sqsq.cli import rolling
from sqsq.cli.clusterdir import (
    LOOPBACK,
    ClusterDirError,
    GatewayProcess,
    NodeProcess,
    read_layout,
    write_layout,
)
from sqsq.cli.clusterstatus import read_status
from sqsq.cli.localprocs import (
    EtcdProcess,
    Wrap,
    free_port,
    free_port_range,
    reserve_ports,
    terminate,
    wait_for_port,
)

READY_TIMEOUT_S = 90.0
SEED_FILE = "restore-seed.json"  # `sqsq restore --cluster-dir`: records for the new etcd


class Placement(Protocol):
    """Where a cluster's processes run, by name: "etcd", "gateway", each node's id, and
    "client" (where ``LocalCluster.status`` reads etcd from)."""

    def address(self, name: str) -> str:
        """The address the process binds to and is reached at."""
        ...

    def command(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` made into a command that runs it there (same pid: it must exec)."""
        ...


class LocalCluster:
    """etcd, ``nodes`` nodes and a gateway under ``root``, all on 127.0.0.1 unless a
    ``placement`` says where each runs.

    A ``root`` that already holds a cluster (its ``cluster.json``) is that cluster again:
    the same node ids, ports and data, so the partition map and the Raft groups, which
    remember addresses, find every member where it was. ``nodes``, ``shards`` and
    ``partitions`` then default to the recorded ones and must match them if given; gateway
    ports given override the recorded ones (the gateway keeps no state)."""

    def __init__(self, root: Path, *, nodes: int | None = None, shards: int | None = None,
                 partitions: int | None = None, etcd_members: int | None = None,
                 nodes_per_host: int = 1,
                 gateway_grpc_port: int | None = None, gateway_http_port: int | None = None,
                 node_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 placement: Placement | None = None) -> None:
        self.root = root.resolve()
        self.placement = placement
        self.layout = read_layout(self.root)
        recorded = self.layout or {}
        had_etcd = len(recorded.get("etcd_members") or [recorded.get("etcd")])
        for what, given, had in (("nodes", nodes, len(recorded.get("nodes", ()))),
                                 ("etcd-members", etcd_members, had_etcd),
                                 ("shards", shards, recorded.get("shards")),
                                 ("partitions", partitions, recorded.get("partitions"))):
            if self.layout is not None and given is not None and given != had:
                raise ClusterDirError(
                    f"{self.root} holds a cluster with {what} {had}, not {given}: leave "
                    f"--{what} out to start it again, or use another --dir")
        self.shards = shards or recorded.get("shards") or 1
        self.partitions = partitions or recorded.get("partitions") or 1
        self.node_args = node_args
        self.env = dict(os.environ if env is None else env)
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self.secret = self.root / "secret"
        if not self.secret.exists():
            fd = os.open(self.secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32))
        # one admin credential for the nodes, the gateway and this process's status calls
        admincred.for_children(self.env, self.root)
        admincred.use_directory(self.root)
        # ports given are the gateway's: never picked for another member
        reserve_ports([p for p in (gateway_grpc_port, gateway_http_port) if p])
        if self.layout is None:
            self.etcds = self._etcd_members([{} for _ in range(etcd_members or 1)])
            # Nodes on one machine stand for ``nodes_per_host`` per host: each gets the
            # label of its pretend host, and no shard has two replicas on one.
            self.nodes = [NodeProcess(f"n{i + 1}", self.root / f"n{i + 1}", free_port(),
                                      free_port_range(self.shards),
                                      host=self._address(f"n{i + 1}"),
                                      host_label=f"host{i // nodes_per_host + 1}")
                          for i in range(nodes or 3)]
            gateway = {"grpc_port": gateway_grpc_port, "http_port": gateway_http_port}
        else:
            g = recorded["gateway"]
            self.etcds = self._etcd_members(recorded.get("etcd_members") or
                                            [recorded["etcd"]])
            self.nodes = [NodeProcess(n["id"], self.root / n["id"], n["grpc_port"],
                                      n["raft_port"], host=self._address(n["id"]),
                                      metrics_port=n["metrics_port"],
                                      host_label=n.get("host_label") or f"host{i + 1}")
                          for i, n in enumerate(recorded["nodes"])]
            gateway = {"grpc_port": gateway_grpc_port or g["grpc_port"],
                       "http_port": gateway_http_port or g["http_port"],
                       "metrics_port": g["metrics_port"]}
            reserve_ports([*(p for e in self.etcds for p in (e.client_port, e.peer_port)),
                           *gateway.values(),
                           *(p for n in self.nodes for p in (
                               n.grpc_port, n.metrics_port, n.raft_port))])
        self.supervisor_pid: int | None = None  # `cluster up`'s, which `restart` signals
        self.gateway = GatewayProcess(host=self._address("gateway"), **{
            k: v for k, v in gateway.items() if v is not None})

    def _etcd_members(self, recorded: list[dict[str, Any]]) -> list[EtcdProcess]:
        """One etcd, or the members of an etcd cluster (etcd1, etcd2, ...: a majority of
        them keeps the partition map available), on the recorded ports if any."""
        names = ["etcd"] if len(recorded) == 1 else [f"etcd{i + 1}" for i in
                                                      range(len(recorded))]
        members = [EtcdProcess(self.root / name, host=self._address(name), wrap=self._wrap(name),
                               **({"client_port": r["client_port"], "peer_port": r["peer_port"]}
                                  if r else {}),
                               **({} if len(recorded) == 1 else {"name": name}))
                   for name, r in zip(names, recorded, strict=True)]
        if len(members) > 1:
            everyone = ",".join(f"{m.name}={m.peer_url}" for m in members)
            for m in members:
                m.initial_cluster = everyone
        self.etcd = members[0]
        return members

    @property
    def etcd_endpoint(self) -> str:
        """What the nodes and the gateway are given: every etcd member's client address."""
        return ",".join(e.endpoint for e in self.etcds)

    def etcd_name(self, member: EtcdProcess) -> str:
        return member.data_dir.name

    # -- processes -------------------------------------------------------------------------

    def _address(self, name: str) -> str:
        return LOOPBACK if self.placement is None else self.placement.address(name)

    def _wrap(self, name: str) -> Wrap | None:
        placement = self.placement
        if placement is None:
            return None
        return lambda argv: placement.command(name, argv)

    def _spawn(self, name: str, args: list[str], *, on: str | None = None) -> subprocess.Popen:
        """``sqsq ARGS`` logging to ``logs/NAME.log``, run where the placement puts ``on``
        (default: ``name``)."""
        argv = [sys.executable, "-m", "sqsq.cli.main", *args]
        wrap = self._wrap(on or name)
        log = open(self.root / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - the child's
        try:
            return subprocess.Popen(argv if wrap is None else wrap(argv),
                                    stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                    start_new_session=True)  # Ctrl-C reaches us, not them
        finally:
            log.close()

    def start_node(self, node: NodeProcess, *, wait: bool = True) -> None:
        """Start ``node``; ``wait``: until its gRPC port listens (else ``wait_listening``)."""
        node.proc = self._spawn(node.node_id, [
            "node", "--etcd", self.etcd_endpoint, "--node-id", node.node_id,
            "--data-dir", str(node.root), "--host", node.host,
            "--grpc-port", str(node.grpc_port), "--raft-port", str(node.raft_port),
            "--shards", str(self.shards), "--initial-nodes", str(len(self.nodes)),
            "--secret-file", str(self.secret), "--metrics-port", str(node.metrics_port),
            "--host-label", node.host_label, *self.node_args])
        if wait:
            self.wait_listening(node)

    def start_gateway(self, *, wait: bool = True) -> None:
        g = self.gateway
        g.proc = self._spawn("gateway", [
            "gateway", "--etcd", self.etcd_endpoint, "--host", g.host,
            "--grpc-port", str(g.grpc_port), "--http-port", str(g.http_port),
            "--partitions", str(self.partitions), "--metrics-port", str(g.metrics_port)])
        if wait:
            self.wait_listening(g)

    def wait_gateway_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until the gateway's ``/readyz`` answers 200: its map has every shard, and each
        shard's leader answers it (started before the shards were, it learns them from its
        watch of the map)."""
        deadline = time.monotonic() + timeout_s
        while not rolling.process_ready(self, self.gateway):
            if self.gateway.proc is None or self.gateway.proc.poll() is not None:
                raise OSError("the gateway exited while the cluster started")
            if time.monotonic() > deadline:
                raise OSError(f"the gateway was not ready within {timeout_s}s")
            time.sleep(0.05)

    def wait_listening(self, proc: NodeProcess | GatewayProcess) -> None:
        """Until the node's or the gateway's gRPC port listens (an error if it exits)."""
        assert proc.proc is not None
        name = proc.node_id if isinstance(proc, NodeProcess) else "gateway"
        wait_for_port(proc.grpc_port, proc.proc, host=proc.host, wrap=self._wrap(name))

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> LocalCluster:
        """Everything, then wait until every shard has a leader. ``cluster.json`` is written
        before the first process starts (so a cluster whose first start failed halfway can
        be started again as itself) and again with the pids once it is ready."""
        self.write_json()
        try:
            for member in self.etcds:  # all running before any can serve
                member.launch()
            for member in self.etcds:
                member.wait_serving()
            self.load_seed()
            # Started together: each takes a second or more to come up (Python, gRPC), and
            # the gateway needs only etcd (it follows the map as the shards appear).
            for node in self.nodes:
                self.start_node(node, wait=False)
            self.start_gateway(wait=False)
            for proc in (*self.nodes, self.gateway):
                self.wait_listening(proc)
            self.wait_ready(timeout_s)
            self.wait_gateway_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.write_json()
        return self

    def load_seed(self) -> None:
        """A restored cluster's partition map (``sqsq restore --cluster-dir``): its shard
        records (the nodes holding each restored replica) and queue records, written into
        the new etcd once, before the first node starts; then renamed ``*.loaded``."""
        path = self.root / SEED_FILE
        if not path.exists():
            return
        seed = json.loads(path.read_text())
        if seed["shards"] != self.shards:
            raise OSError(f"{path}: the restored cluster has {seed['shards']} shards, not "
                          f"{self.shards}: start it with --shards {seed['shards']}")
        from sqsq.control.etcd import CasConflict, Etcd

        async def put() -> None:
            async with Etcd(self.etcd_endpoint, retry_for_s=10.0) as etcd:
                for record in seed["records"]:
                    value = json.dumps(record["value"], separators=(",", ":"),
                                       sort_keys=True).encode()
                    try:  # create-only: a seed loaded before (then interrupted) is kept
                        await etcd.compare_and_put(record["key"], value, 0)
                    except CasConflict:
                        pass

        asyncio.run(put())
        os.replace(path, path.with_name(SEED_FILE + ".loaded"))

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
        """The status once every shard exists and has a live leader (``OSError`` if not
        within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            shards = status["shards"]
            if len(shards) == self.shards and all(s["leader"] for s in shards):
                return status
            if time.monotonic() > deadline:
                raise OSError(f"the cluster was not ready within {timeout_s}s: {status}")
            time.sleep(0.2)

    def status(self, *, replicas: bool = False) -> dict[str, Any]:
        """The partition map's view; with ``replicas``, each live node's replica states."""
        if self.placement is None:
            return read_status(self.etcd_endpoint, replicas=replicas)
        # This process may have no route to etcd: ask from the placement's client host.
        argv = self.placement.command("client", [
            sys.executable, "-m", "sqsq.cli.main", "cluster", "status", "--etcd",
            self.etcd_endpoint, "--json", *(["--replicas"] if replicas else [])])
        out = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=60)
        if out.returncode != 0:
            raise OSError(f"sqsq cluster status failed ({out.returncode}): {out.stderr}")
        return json.loads(out.stdout)

    def port_uses(self) -> list[tuple[int, str]]:
        """Every port the cluster's processes listen on, with what for."""
        g = self.gateway
        return [*((p, f"{self.etcd_name(e)} {use}") for e in self.etcds for p, use in (
                    (e.client_port, "client"), (e.peer_port, "peer"))),
                (g.grpc_port, "gateway gRPC"), (g.http_port, "gateway SQS HTTP"),
                (g.metrics_port, "gateway metrics"),
                *((p, f"{n.node_id} {use}") for n in self.nodes for p, use in (
                    (n.grpc_port, "gRPC"), (n.metrics_port, "metrics"),
                    (n.raft_port, "Raft")))]

    def names(self) -> list[str]:
        """Every process of the cluster by name: "etcd" (or "etcd1", "etcd2", ... for the
        members of an etcd cluster), the node ids, "gateway"."""
        return [*map(self.etcd_name, self.etcds), *(n.node_id for n in self.nodes), "gateway"]

    def process(self, name: str) -> subprocess.Popen | None:
        member = next((e for e in self.etcds if self.etcd_name(e) == name), None)
        if member is not None:
            return member.proc
        if name == "gateway":
            return self.gateway.proc
        return self.node(name).proc

    def node(self, node_id: str) -> NodeProcess:
        found = next((n for n in self.nodes if n.node_id == node_id), None)
        if found is None:
            raise KeyError(f"no process {node_id!r} in this cluster "
                           f"(it has {', '.join(self.names())})")
        return found

    def start_process(self, name: str) -> None:
        """Start ``name`` (see ``names``) again, with the same identity, ports and data."""
        member = next((e for e in self.etcds if self.etcd_name(e) == name), None)
        if member is not None:
            member.start()
        elif name == "gateway":
            self.start_gateway()
        else:
            self.start_node(self.node(name))

    def kill9(self, proc: subprocess.Popen | None) -> None:
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def terminate(self, proc: subprocess.Popen | None, timeout_s: float = 20.0) -> None:
        if proc is not None:
            terminate(proc, timeout_s)

    def stop(self) -> None:
        """Every process this cluster started, by pid: gateway, nodes, etcd."""
        self.terminate(self.gateway.proc)
        for node in self.nodes:
            self.terminate(node.proc)
        for member in self.etcds:
            if member.proc is not None:
                member.stop()

    def rolling_restart(self, *, timeout_s: float = READY_TIMEOUT_S,
                        report: Callable[[dict[str, Any]], None] = lambda step: None
                        ) -> list[dict[str, Any]]:
        """Every node restarted in turn, leaders last, each ready before the next
        (``sqsq.cli.rolling``); one step per node."""
        from sqsq.cli.rolling import rolling_restart

        return rolling_restart(self, timeout_s=timeout_s, report=report)

    def write_json(self) -> Path:
        etcds = [{"name": self.etcd_name(e), "pid": e.proc.pid if e.proc else None,
                  "client_port": e.client_port, "peer_port": e.peer_port} for e in self.etcds]
        return write_layout(self.root, {
            "gateway": {"pid": self.gateway.proc.pid if self.gateway.proc else None,
                        "grpc_port": self.gateway.grpc_port,
                        "http_port": self.gateway.http_port,
                        "metrics_port": self.gateway.metrics_port},
            "etcd": etcds[0],
            "etcd_members": etcds,
            "nodes": [{"id": n.node_id, "pid": n.proc.pid if n.proc else None,
                       "grpc_port": n.grpc_port, "raft_port": n.raft_port,
                       "metrics_port": n.metrics_port, "data_dir": str(n.root),
                       "host_label": n.host_label}
                      for n in self.nodes],
            "shards": self.shards,
            "partitions": self.partitions,
            "supervisor_pid": self.supervisor_pid,
        })
