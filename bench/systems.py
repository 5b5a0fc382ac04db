"""The systems under test: how each is started, stopped, reached, and how durable it is.

Every target names a system and a driver. A target whose system cannot run here (a package
missing, an API not built yet) is recorded as skipped with the reason, never as a number.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.procs import Proc, free_port, port_open

REPO = Path(__file__).resolve().parent.parent
_ADMIN_ENV = ("SQSQ_ADMIN_TOKEN", "SQSQ_ADMIN_TOKEN_FILE")  # sqsq.admincred's


class Skip(Exception):
    """This target cannot run here; the message says why."""


def keep_logs(workdir: Path, kept: Path) -> Path | None:
    """Copy every log file under a target's work directory (deleted after the target) to
    ``kept``, keeping their paths; ``kept``, or None if there was none. A cluster that fails
    to start is diagnosed from these (a node that "exited 1 at start" says why only there)."""
    logs = [p for p in workdir.rglob("*.log") if p.is_file()]
    for p in logs:
        dest = kept / p.relative_to(workdir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, dest)
    return kept if logs else None


class System:
    """One system under test. ``start`` returns the driver spec the workers connect with."""

    durability = ""
    supports_fifo = True

    def __init__(self) -> None:
        self.procs: list[Proc] = []

    def start(self, workdir: Path) -> dict[str, Any]:
        raise NotImplementedError

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()

    def version(self) -> str:
        return ""

    def pids(self) -> list[int]:
        """The system's own processes (their CPU time is the system's; children count too)."""
        return [p.pid for p in self.procs]

    def gateway_pids(self) -> list[int]:
        """Those of its processes that are gateways (their CPU is also shown on its own)."""
        return []


def _pkg_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


class SqsqServer(System):
    """``sqsq server`` (single node, one shard, fsync on), or an already running one; with
    ``via="gateway"`` the clients reach it through a ``sqsq gateway`` process (gRPC). With
    ``batching=False`` the SDK makes one RPC per single-message call; with ``frames=False``
    it stays on the gRPC stream instead of the server's frame connection."""

    durability = "Raft, one member: the journal entry fdatasynced before any reply"

    def __init__(self, via: str = "grpc", endpoint: str | None = None,
                 batching: bool = True, prefetch: bool = False, frames: bool = True) -> None:
        super().__init__()
        self.via = via
        self.endpoint = endpoint
        self.batching = batching
        self.prefetch = prefetch
        self.frames = frames

    def version(self) -> str:
        return _pkg_version("sqsq")

    def start(self, workdir: Path) -> dict[str, Any]:
        if self.endpoint:
            grpc_target, http_url = self.endpoint, f"http://{self.endpoint}"
        else:
            gport, hport = free_port(), free_port()
            proc = Proc("sqsq", [sys.executable, "-m", "sqsq.cli.main", "server",
                                 "--data-dir", str(workdir / "data"), "--host", "127.0.0.1",
                                 "--grpc-port", str(gport), "--http-port", str(hport)],
                        workdir / "sqsq.log", env={"SQSQ_LOG_LEVEL": "WARNING"}, cwd=REPO)
            self.procs.append(proc)
            proc.wait_port(gport)
            grpc_target, http_url = f"127.0.0.1:{gport}", f"http://127.0.0.1:{hport}"
            if self.via == "gateway":
                grpc_target = self._start_gateway(workdir, grpc_target)
            if self.via == "http":
                _wait_http(hport, proc, 5.0)
        if self.via == "http":
            return {"kind": "boto3", "url": http_url}
        return {"kind": "sqsq-grpc", "endpoint": grpc_target, "batching": self.batching,
                "prefetch": self.prefetch, "frames": self.frames}

    def _start_gateway(self, workdir: Path, backend: str) -> str:
        gport, hport = free_port(), free_port()
        proc = Proc("sqsq-gateway", [sys.executable, "-m", "sqsq.cli.main", "gateway",
                                     "--backend", backend, "--host", "127.0.0.1",
                                     "--grpc-port", str(gport), "--http-port", str(hport)],
                    workdir / "gateway.log", env={"SQSQ_LOG_LEVEL": "WARNING"}, cwd=REPO)
        self.procs.append(proc)
        proc.wait_port(gport)
        return f"127.0.0.1:{gport}"


class SqsqR3(System):
    """One shard replicated by three ``sqsq node`` processes (a Raft group, fsync on); the
    benchmark's SDK clients are given all three nodes and follow the leader."""

    durability = "Raft: entry fdatasynced on a majority of 3 before any reply"

    def __init__(self, batching: bool = True, prefetch: bool = False,
                 profile_dir: Path | None = None) -> None:
        """``profile_dir``: each node runs under cProfile and writes ``nodeN.prof`` there
        when it stops (``python -m bench.raftprof``)."""
        super().__init__()
        self.batching = batching
        self.prefetch = prefetch
        self.profile_dir = profile_dir

    def version(self) -> str:
        return _pkg_version("sqsq")

    def start(self, workdir: Path) -> dict[str, Any]:
        secret = workdir / "cluster-secret"
        secret.write_bytes(os.urandom(32))
        nodes = [(free_port(), free_port()) for _ in range(3)]
        peers = ",".join(f"127.0.0.1:{g}:{r}" for g, r in nodes)
        for i, (gport, rport) in enumerate(nodes):
            prof = [] if self.profile_dir is None else [
                "-m", "cProfile", "-o", str(self.profile_dir / f"node{i}.prof")]
            proc = Proc(f"sqsq-node{i}", [
                sys.executable, *prof, "-m", "sqsq.cli.main", "node", "--data-dir",
                str(workdir / f"node{i}"), "--host", "127.0.0.1", "--grpc-port", str(gport),
                "--raft-port", str(rport), "--peers", peers, "--bootstrap",
                "--secret-file", str(secret)],
                workdir / f"node{i}.log", env={"SQSQ_LOG_LEVEL": "WARNING"}, cwd=REPO)
            self.procs.append(proc)
        for gport, _ in nodes:
            _wait_port(gport)
        return {"kind": "sqsq-grpc", "endpoint": ",".join(f"127.0.0.1:{g}" for g, _ in nodes),
                "batching": self.batching, "prefetch": self.prefetch}


class SqsqCluster(System):
    """``sqsq cluster up`` as the tests start it: etcd, three nodes (every shard on all three;
    or three host labels of ``nodes_per_host`` nodes), one gateway; clients are given the
    gateway's address. With 4 shards, a queue gets 4 partitions. ``via``: ``direct`` (the SDK
    calls the shard leaders itself), ``gateway`` (the SDK with direct routing off: every call
    through the gateway, as another language's gRPC client), ``http`` (boto3 through the
    gateway's SQS HTTP front)."""

    durability = "Raft: entry fdatasynced on a majority of 3 before any reply"

    def __init__(self, shards: int, partitions: int = 1, via: str = "direct",
                 nodes_per_host: int = 1, fsync: bool = True) -> None:
        """``nodes_per_host``: three host labels with this many nodes each (all on this
        machine), no shard with two replicas under one label: how a machine with more cores
        than one node uses is meant to be run (issue 33), measured against one per label.
        ``fsync=False``: the nodes run with ``--no-fsync`` (acknowledged writes can be lost
        to a power cut): what the Raft logs' fsyncs cost, measured against the same
        cluster with them."""
        super().__init__()
        self.shards = shards
        self.partitions = partitions
        self.via = via
        self.nodes_per_host = nodes_per_host
        self.fsync = fsync
        if not fsync:
            self.durability = "none: nodes with --no-fsync (what fsync costs; not for use)"
        self.cluster: Any = None
        self._saved_env: dict[str, str | None] = {}

    def version(self) -> str:
        return _pkg_version("sqsq")

    def start(self, workdir: Path) -> dict[str, Any]:
        from sqsq.cli.cluster import LocalCluster

        # A cluster points this process at its admin credential (an env variable naming a
        # file in its directory); left set, the next cluster of the run would hand its nodes
        # the file of one already stopped and deleted, and each exits 1 at start ("No such
        # file or directory: .../admin-token"). Each cluster starts without, and ``stop``
        # puts back what was there before.
        self._saved_env = {k: os.environ.pop(k, None) for k in _ADMIN_ENV}
        env = dict(os.environ, SQSQ_LOG_LEVEL="WARNING")
        self.cluster = LocalCluster(workdir / "cluster", nodes=3 * self.nodes_per_host,
                                    nodes_per_host=self.nodes_per_host, shards=self.shards,
                                    partitions=self.partitions, env=env,
                                    node_args=() if self.fsync else ("--no-fsync",)).start()
        if self.via == "http":
            return {"kind": "boto3", "url": self.cluster.gateway.http_url}
        return {"kind": "sqsq-grpc", "endpoint": self.cluster.gateway.endpoint,
                "direct": self.via == "direct"}

    def pids(self) -> list[int]:
        if self.cluster is None:
            return []
        parts = [self.cluster.etcd, *self.cluster.nodes, self.cluster.gateway]
        return [p.proc.pid for p in parts if p.proc is not None]

    def gateway_pids(self) -> list[int]:
        gateway = None if self.cluster is None else self.cluster.gateway.proc
        return [] if gateway is None else [gateway.pid]

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}


def _wait_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not port_open(port):
        time.sleep(0.1)
    if not port_open(port):
        raise Skip(f"a sqsq node did not listen on {port} within {timeout_s}s")


def _wait_http(port: int, proc: Proc, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not port_open(port):
        time.sleep(0.1)
    if not port_open(port):
        raise Skip("the SQS HTTP API does not answer yet (nothing listens on --http-port)")
    try:
        from bench.drivers import make_driver

        async def probe() -> None:
            d = make_driver({"kind": "boto3", "url": f"http://127.0.0.1:{port}"}, 2)
            await d.open()
            await d.close()

        asyncio.run(probe())
    except Exception as exc:
        raise Skip(f"the SQS HTTP API does not answer ListQueues yet: {exc}") from exc


class MotoServer(System):
    durability = "none: in memory (moto_server)"

    def version(self) -> str:
        return _pkg_version("moto")

    def start(self, workdir: Path) -> dict[str, Any]:
        try:
            import moto.server  # noqa: F401
        except ImportError as exc:
            raise Skip("moto[server] is not installed (bash bench/install_peers.sh)") from exc
        port = free_port()
        proc = Proc("moto", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], workdir / "moto.log")
        self.procs.append(proc)
        proc.wait_port(port)
        return {"kind": "boto3", "url": f"http://127.0.0.1:{port}"}


class Placeholder(System):
    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason

    def start(self, workdir: Path) -> dict[str, Any]:
        raise Skip(self.reason)


NOT_DURABLE = "-nofsync"  # the name's ending of a target that does not fsync


def targets(sqsq_endpoint: str | None = None) -> dict[str, Callable[[], System]]:
    """Every target by name, in the order of a full run."""
    from bench.peers import NatsServer, RabbitServer

    return {
        "sqsq-grpc": lambda: SqsqServer("grpc", sqsq_endpoint),
        # the SDK without its automatic batching: one RPC per single-message call
        "sqsq-grpc-nobatch": lambda: SqsqServer("grpc", sqsq_endpoint, batching=False),
        # the SDK on the gRPC stream only, not the server's frame connection
        "sqsq-grpc-noframes": lambda: SqsqServer("grpc", sqsq_endpoint, frames=False),
        # the SDK's opt-in receive prefetch for one-message receives (batching on)
        "sqsq-grpc-prefetch": lambda: SqsqServer("grpc", sqsq_endpoint, prefetch=True),
        "sqsq-http": lambda: SqsqServer("http", sqsq_endpoint),
        "sqsq-gateway": lambda: SqsqServer("gateway"),
        "sqsq-r3": SqsqR3,
        "sqsq-r3-nobatch": lambda: SqsqR3(batching=False),
        "sqsq-r3-prefetch": lambda: SqsqR3(prefetch=True),
        "sqsq-cluster": lambda: SqsqCluster(shards=1),
        # the SDK with direct routing off: every call through the cluster's gateway
        "sqsq-cluster-gateway": lambda: SqsqCluster(shards=1, via="gateway"),
        # boto3 through the cluster gateway's SQS HTTP front (against sqsq-http on one node)
        "sqsq-cluster-http": lambda: SqsqCluster(shards=1, via="http"),
        "sqsq-cluster-4": lambda: SqsqCluster(shards=4, partitions=4),
        # three host labels of 2 (3) nodes each on this machine, against sqsq-cluster-4's 1
        "sqsq-cluster-4-2ph": lambda: SqsqCluster(shards=4, partitions=4, nodes_per_host=2),
        "sqsq-cluster-4-3ph": lambda: SqsqCluster(shards=4, partitions=4, nodes_per_host=3),
        # the same two clusters with no fsync (not durable): what the Raft logs' fsyncs cost
        "sqsq-cluster" + NOT_DURABLE: lambda: SqsqCluster(shards=1, fsync=False),
        "sqsq-cluster-4" + NOT_DURABLE: lambda: SqsqCluster(shards=4, partitions=4, fsync=False),
        "moto": MotoServer,
        "nats-r1": lambda: NatsServer(replicas=1),
        "nats-r3": lambda: NatsServer(replicas=3),
        "rabbitmq-quorum": RabbitServer,
    }
