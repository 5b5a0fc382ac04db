"""``sqsq cluster up``, ``status`` and ``restart``: a whole cluster on this machine.

    sqsq cluster up --nodes 3 --shards 4 --dir ./cluster      # etcd, 3 nodes, a gateway
    sqsq cluster status --dir ./cluster [--json]
    sqsq cluster restart --rolling --dir ./cluster            # while `up` runs

``up`` starts etcd, the nodes and a gateway as child processes listening on 127.0.0.1, waits
until every shard has a leader and the gateway answers, writes ``DIR/cluster.json`` (pids
and ports), and stays in the foreground: Ctrl-C (or SIGTERM) stops them all, by pid. Each
process logs to ``DIR/logs/``. The tests start clusters through ``LocalCluster`` too.

A ``Placement`` puts each process somewhere else instead (the chaos tests: one network
namespace per process, so links between them can be cut); ``status`` is then read by
``sqsq cluster status --etcd`` run on the placement's "client" host.

``restart --rolling``: see ``sqsq.cli.rolling``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sqsq.cli import rolling
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
DEFAULT_GRPC_PORT = 7400  # the gateway's, as `sqsq server`'s
DEFAULT_HTTP_PORT = 9324
LOOPBACK = "127.0.0.1"
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


@dataclass
class NodeProcess:
    node_id: str
    root: Path
    grpc_port: int
    raft_port: int
    proc: subprocess.Popen | None = None
    host: str = LOOPBACK
    metrics_port: int = field(default_factory=free_port)  # /metrics, /healthz, /readyz

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class GatewayProcess:
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    host: str = LOOPBACK
    metrics_port: int = field(default_factory=free_port)

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"


class ClusterDirError(OSError):
    """A ``--dir`` that cannot be started: half-written, another version's, or in use."""


#: What ``cluster.json`` looks like; a directory written in another format is refused, not
#: guessed at (its ports and node ids are what the partition map and Raft groups remember).
LAYOUT_FORMAT = 1


def read_layout(root: Path) -> dict[str, Any] | None:
    """The cluster a directory holds (its ``cluster.json``), or None for a new one;
    ``ClusterDirError`` for a directory that cannot be started again as it is."""
    path = root / "cluster.json"
    if not path.exists():
        if (root / "etcd").exists():
            raise ClusterDirError(
                f"{root} has etcd data but no cluster.json: a half-written cluster whose "
                "node ids and ports are lost; remove it or use another --dir")
        return None
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ClusterDirError(f"{path} is half-written or damaged ({exc}); remove {root} "
                              "or use another --dir") from None
    if not isinstance(info, dict) or info.get("format") != LAYOUT_FORMAT:
        found = info.get("format") if isinstance(info, dict) else None
        raise ClusterDirError(
            f"{path} was written by another version of sqsq (cluster directory format "
            f"{found!r}, this one starts format {LAYOUT_FORMAT}): start it with that version, "
            "or use another --dir")
    try:
        for n in info["nodes"]:
            n["id"], n["grpc_port"], n["raft_port"], n["metrics_port"]  # noqa: B018
        info["etcd"]["client_port"], info["etcd"]["peer_port"]  # noqa: B018
        info["gateway"]["grpc_port"], info["gateway"]["http_port"]  # noqa: B018
        info["gateway"]["metrics_port"], info["shards"], info["partitions"]  # noqa: B018
    except (KeyError, TypeError) as exc:
        raise ClusterDirError(f"{path} is half-written or damaged (no {exc}); remove "
                              f"{root} or use another --dir") from None
    return info


class LocalCluster:
    """etcd, ``nodes`` nodes and a gateway under ``root``, all on 127.0.0.1 unless a
    ``placement`` says where each runs.

    A ``root`` that already holds a cluster (its ``cluster.json``) is that cluster again:
    the same node ids, ports and data, so the partition map and the Raft groups, which
    remember addresses, find every member where it was. ``nodes``, ``shards`` and
    ``partitions`` then default to the recorded ones and must match them if given; gateway
    ports given override the recorded ones (the gateway keeps no state)."""

    def __init__(self, root: Path, *, nodes: int | None = None, shards: int | None = None,
                 partitions: int | None = None,
                 gateway_grpc_port: int | None = None, gateway_http_port: int | None = None,
                 node_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 placement: Placement | None = None) -> None:
        self.root = root.resolve()
        self.placement = placement
        self.layout = read_layout(self.root)
        recorded = self.layout or {}
        for what, given, had in (("nodes", nodes, len(recorded.get("nodes", ()))),
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
        if self.layout is None:
            self.etcd = EtcdProcess(self.root / "etcd", host=self._address("etcd"),
                                    wrap=self._wrap("etcd"))
            self.nodes = [NodeProcess(f"n{i + 1}", self.root / f"n{i + 1}", free_port(),
                                      free_port_range(self.shards),
                                      host=self._address(f"n{i + 1}"))
                          for i in range(nodes or 3)]
            gateway = {"grpc_port": gateway_grpc_port, "http_port": gateway_http_port}
        else:
            e, g = recorded["etcd"], recorded["gateway"]
            self.etcd = EtcdProcess(self.root / "etcd", e["client_port"], e["peer_port"],
                                    host=self._address("etcd"), wrap=self._wrap("etcd"))
            self.nodes = [NodeProcess(n["id"], self.root / n["id"], n["grpc_port"],
                                      n["raft_port"], host=self._address(n["id"]),
                                      metrics_port=n["metrics_port"])
                          for n in recorded["nodes"]]
            gateway = {"grpc_port": gateway_grpc_port or g["grpc_port"],
                       "http_port": gateway_http_port or g["http_port"],
                       "metrics_port": g["metrics_port"]}
            reserve_ports([self.etcd.client_port, self.etcd.peer_port, *gateway.values(),
                           *(p for n in self.nodes for p in (
                               n.grpc_port, n.metrics_port,
                               *range(n.raft_port, n.raft_port + self.shards)))])
        self.supervisor_pid: int | None = None  # `cluster up`'s, which `restart` signals
        self.gateway = GatewayProcess(host=self._address("gateway"), **{
            k: v for k, v in gateway.items() if v is not None})

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

    def start_node(self, node: NodeProcess) -> None:
        node.proc = self._spawn(node.node_id, [
            "node", "--etcd", self.etcd.endpoint, "--node-id", node.node_id,
            "--data-dir", str(node.root), "--host", node.host,
            "--grpc-port", str(node.grpc_port), "--raft-port", str(node.raft_port),
            "--shards", str(self.shards), "--initial-nodes", str(len(self.nodes)),
            "--secret-file", str(self.secret), "--metrics-port", str(node.metrics_port),
            *self.node_args])
        wait_for_port(node.grpc_port, node.proc, host=node.host, wrap=self._wrap(node.node_id))

    def start_gateway(self) -> None:
        g = self.gateway
        g.proc = self._spawn("gateway", [
            "gateway", "--etcd", self.etcd.endpoint, "--host", g.host,
            "--grpc-port", str(g.grpc_port), "--http-port", str(g.http_port),
            "--partitions", str(self.partitions), "--metrics-port", str(g.metrics_port)])
        wait_for_port(g.grpc_port, g.proc, host=g.host, wrap=self._wrap("gateway"))

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> LocalCluster:
        """Everything, then wait until every shard has a leader. ``cluster.json`` is written
        before the first process starts (so a cluster whose first start failed halfway can
        be started again as itself) and again with the pids once it is ready."""
        self.write_json()
        try:
            self.etcd.start()
            self.load_seed()
            for node in self.nodes:
                self.start_node(node)
            self.wait_ready(timeout_s)
            self.start_gateway()
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
            async with Etcd(self.etcd.endpoint, retry_for_s=10.0) as etcd:
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
            return read_status(self.etcd.endpoint, replicas=replicas)
        # This process may have no route to etcd: ask from the placement's client host.
        argv = self.placement.command("client", [
            sys.executable, "-m", "sqsq.cli.main", "cluster", "status", "--etcd",
            self.etcd.endpoint, "--json", *(["--replicas"] if replicas else [])])
        out = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=60)
        if out.returncode != 0:
            raise OSError(f"sqsq cluster status failed ({out.returncode}): {out.stderr}")
        return json.loads(out.stdout)

    def names(self) -> list[str]:
        """Every process of the cluster by name: "etcd", the node ids, "gateway"."""
        return ["etcd", *(n.node_id for n in self.nodes), "gateway"]

    def process(self, name: str) -> subprocess.Popen | None:
        if name == "etcd":
            return self.etcd.proc
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
        if name == "etcd":
            self.etcd.start()
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
        if self.etcd.proc is not None:
            self.etcd.stop()

    def rolling_restart(self, *, timeout_s: float = READY_TIMEOUT_S,
                        report: Callable[[dict[str, Any]], None] = lambda step: None
                        ) -> list[dict[str, Any]]:
        """Every node restarted in turn, leaders last, each ready before the next
        (``sqsq.cli.rolling``); one step per node."""
        from sqsq.cli.rolling import rolling_restart

        return rolling_restart(self, timeout_s=timeout_s, report=report)

    def write_json(self) -> Path:
        path = self.root / "cluster.json"
        body = {
            "format": LAYOUT_FORMAT,
            "gateway": {"pid": self.gateway.proc.pid if self.gateway.proc else None,
                        "grpc_port": self.gateway.grpc_port,
                        "http_port": self.gateway.http_port,
                        "metrics_port": self.gateway.metrics_port},
            "etcd": {"pid": self.etcd.proc.pid if self.etcd.proc else None,
                     "client_port": self.etcd.client_port, "peer_port": self.etcd.peer_port},
            "nodes": [{"id": n.node_id, "pid": n.proc.pid if n.proc else None,
                       "grpc_port": n.grpc_port, "raft_port": n.raft_port,
                       "metrics_port": n.metrics_port, "data_dir": str(n.root)}
                      for n in self.nodes],
            "shards": self.shards,
            "partitions": self.partitions,
            "supervisor_pid": self.supervisor_pid,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, indent=2) + "\n")
        os.replace(tmp, path)
        return path


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

    nodes = [{"id": n, "alive": n in snapshot.nodes, "grpc": snapshot.members[n].grpc_address}
             for n in sorted(snapshot.members)]
    return {
        "nodes": nodes,
        "shards": [{"id": s.shard_id, "epoch": s.epoch, "replicas": list(s.replicas),
                    **hint(s.shard_id)}
                   for s in sorted(snapshot.shards.values(), key=lambda s: s.shard_id)],
        "queues": [{"name": q.name, "partitions": list(q.partitions)}
                   for q in sorted(snapshot.queues.values(), key=lambda q: q.name)],
        **({"replicas": rolling.read_replicas(nodes)} if replicas else {}),
    }


# -- the commands ----------------------------------------------------------------------------

def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("cluster", help="run a local cluster, or show its state")
    sub = p.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="start etcd, the nodes and a gateway in the foreground")
    up.add_argument("--nodes", type=int, default=None,
                    help="how many nodes (at least 3; default 3, or the directory's)")
    up.add_argument("--shards", type=int, default=None,
                    help="how many shards (default 1, or the directory's)")
    up.add_argument("--partitions", type=int, default=None,
                    help="partitions of a new queue, each on its own shard (default 1, or "
                         "the directory's)")
    up.add_argument("--dir", type=Path, default=Path("./cluster"),
                    help="where data, logs and cluster.json go; a directory that holds a "
                         "cluster starts that cluster again")
    up.add_argument("--grpc-port", type=int, default=None,
                    help="the gateway's gRPC port (default 7400, or the directory's)")
    up.add_argument("--http-port", type=int, default=None,
                    help="the gateway's SQS HTTP port (default 9324, or the directory's)")
    up.add_argument("--restart", choices=("no", "on-failure"), default="no",
                    help="a process that dies: left down (default; `cluster start-node` "
                         "starts it) or started again after a back-off (1 s doubling to 30 s)")
    up.set_defaults(handler=cmd_up, needs_client=False)
    st = sub.add_parser("status", help="nodes, shards with their leaders, queues")
    st.add_argument("--dir", type=Path, default=Path("./cluster"),
                    help="the directory `cluster up` wrote cluster.json to")
    st.add_argument("--etcd", metavar="ENDPOINT", default=None,
                    help="read the cluster's etcd at host:port instead of --dir's cluster.json")
    st.add_argument("--json", dest="as_json", action="store_true", help="print JSON")
    st.add_argument("--replicas", action="store_true",
                    help="also ask each live node for its replicas' Raft progress")
    st.set_defaults(handler=cmd_status, needs_client=False)
    rs = sub.add_parser("restart", help="restart the nodes of a running `cluster up`")
    rs.add_argument("--rolling", action="store_true", required=True,
                    help="one node at a time, leaders last, each ready before the next")
    rs.add_argument("--dir", type=Path, default=Path("./cluster"),
                    help="the directory of the running `cluster up`")
    rs.set_defaults(handler=rolling.cmd_restart, needs_client=False)
    from sqsq.cli import supervisor

    supervisor.add_parser(sub)
    return p


def cmd_up(args: argparse.Namespace) -> int:
    from sqsq.cli.supervisor import Supervisor, running_supervisor, start_on_signal

    if args.nodes is not None and args.nodes < 3:
        print("sqsq cluster up: error: a shard has three replicas: --nodes must be at least 3",
              file=sys.stderr)
        return 2
    if not 1 <= (args.shards or 1) <= 64 or (args.partitions or 1) < 1:
        print("sqsq cluster up: error: --shards is 1..64 and --partitions at least 1",
              file=sys.stderr)
        return 2
    pid = running_supervisor(args.dir)
    if pid is not None:
        print(f"sqsq cluster up: error: the cluster in {args.dir} is already running "
              f"(`sqsq cluster up`, pid {pid})", file=sys.stderr)
        return 1
    new = not (args.dir / "cluster.json").exists()  # a new one gets the usual ports
    try:
        cluster = LocalCluster(
            args.dir, nodes=args.nodes, shards=args.shards, partitions=args.partitions,
            gateway_grpc_port=args.grpc_port or (DEFAULT_GRPC_PORT if new else None),
            gateway_http_port=args.http_port or (DEFAULT_HTTP_PORT if new else None))
    except ClusterDirError as exc:
        print(f"sqsq cluster up: error: {exc}", file=sys.stderr)
        return 1
    again = cluster.layout is not None
    stop = _stop_on_signals()
    restart = rolling.restart_on_signal()
    start_asked = start_on_signal()
    cluster.supervisor_pid = os.getpid()
    try:
        cluster.start()
    except OSError as exc:
        print(f"sqsq cluster up: error: {exc} (logs in {cluster.root / 'logs'})",
              file=sys.stderr)
        return 1
    g = cluster.gateway
    print(f"sqsq cluster: {'started again: ' if again else ''}{len(cluster.nodes)} nodes "
          f"({', '.join(n.node_id for n in cluster.nodes)}), {cluster.shards} "
          f"shard{'s' if cluster.shards > 1 else ''} of three replicas; gateway gRPC on "
          f"{g.endpoint}, SQS HTTP API on {g.http_url}; etcd on "
          f"{cluster.etcd.endpoint}; {cluster.root / 'cluster.json'} written, logs in "
          f"{cluster.root / 'logs'}. A process that dies is reported and "
          f"{'started again' if args.restart == 'on-failure' else 'left down'}; "
          "Ctrl-C stops everything.", flush=True)
    supervisor = Supervisor(cluster, restart=args.restart == "on-failure")
    try:
        while not stop.wait(0.5):
            if restart.is_set():
                restart.clear()
                rolling.serve_restart(cluster)
            supervisor.check()  # a death is reported before a start-node for it is served
            if start_asked.is_set():
                start_asked.clear()
                supervisor.serve_start_request()
    finally:
        print("sqsq cluster: stopping", flush=True)
        cluster.stop()
        print("sqsq cluster: stopped", flush=True)
    return 0


def _stop_on_signals() -> Any:
    import threading

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def cmd_status(args: argparse.Namespace) -> int:
    path = args.dir / "cluster.json"
    if args.etcd:
        where = f"the etcd at {args.etcd}"
    else:
        try:
            info = json.loads(path.read_text())
            args.etcd = f"127.0.0.1:{info['etcd']['client_port']}"
        except FileNotFoundError:
            print(f"sqsq cluster status: error: there is no cluster in {args.dir} (no "
                  f"cluster.json; `sqsq cluster up --dir {args.dir}` starts one)",
                  file=sys.stderr)
            return 1
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"sqsq cluster status: error: {path}: {exc}", file=sys.stderr)
            return 1
        where = f"the cluster in {args.dir}"
    try:
        status = read_status(args.etcd, replicas=args.replicas)
    except Exception:  # noqa: BLE001 - etcd unreachable: say so in one line
        hint = "" if where.startswith("the etcd") else \
            f" (its etcd on {args.etcd} does not answer); start it with: sqsq cluster up " \
            f"--dir {args.dir}"
        print(f"sqsq cluster status: {where} is not running{hint}", file=sys.stderr)
        return 1
    if args.as_json:
        print(json.dumps(status, indent=2))
        return 0
    for n in status["nodes"]:
        print(f"node {n['id']}: {'alive' if n['alive'] else 'DOWN'} ({n['grpc']})")
    for s in status["shards"]:
        print(f"shard {s['id']}: leader {s['leader'] or '-'}, replicas "
              f"{', '.join(s['replicas'])} (epoch {s['epoch']})")
    for q in status["queues"]:
        print(f"queue {q['name']}: partitions on shards "
              f"{', '.join(str(p) for p in q['partitions'])}")
    return 0
