"""Three ``sqsq node`` processes on 127.0.0.1 forming one shard's Raft group, for tests:
started, killed (-9), stopped (SIGSTOP) and resumed, wiped and restarted, always by pid."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from serverproc import REPO, free_port, wait_for_port
from sqsq.cli.cluster import LocalCluster
from sqsq.cli.clusterdir import GatewayProcess
from sqsq.client import Client
from sqsq.errors import QueueError
from sqsq.shard.store import RocksStore


@dataclass
class Node:
    root: Path
    grpc_port: int = field(default_factory=free_port)
    raft_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)  # /metrics, /healthz, /readyz
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def peer(self) -> str:
        return f"127.0.0.1:{self.grpc_port}:{self.raft_port}"


class Cluster:
    def __init__(self, root: Path, n: int = 3, extra_args: tuple[str, ...] = ()) -> None:
        self.root = root
        self.nodes = [Node(root / f"node{i}") for i in range(n)]
        self.secret = root / "cluster-secret"
        self.secret.write_bytes(os.urandom(32))
        self.extra_args = extra_args

    @property
    def endpoints(self) -> str:
        return ",".join(n.endpoint for n in self.nodes)

    def client(self, timeout: float = 30.0) -> Client:
        return Client(self.endpoints, timeout=timeout)

    def start(self, node: Node, *, bootstrap: bool = False) -> None:
        node.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / f"{node.root.name}.log", "ab")  # noqa: SIM115
        node.proc = subprocess.Popen(
            [sys.executable, "-m", "sqsq.cli.main", "node", "--data-dir", str(node.root),
             "--host", "127.0.0.1", "--grpc-port", str(node.grpc_port),
             "--raft-port", str(node.raft_port), "--secret-file", str(self.secret),
             "--peers", ",".join(n.peer for n in self.nodes),
             "--metrics-port", str(node.metrics_port), *self.extra_args,
             *(["--bootstrap"] if bootstrap else [])],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=dict(os.environ))
        log.close()
        wait_for_port(node.grpc_port, node.proc)

    def start_all(self, *, bootstrap: bool = False) -> None:
        for node in self.nodes:
            self.start(node, bootstrap=bootstrap)

    def kill9(self, node: Node) -> None:
        if node.proc is not None and node.proc.poll() is None:
            os.kill(node.proc.pid, signal.SIGKILL)
            node.proc.wait()

    def pause(self, node: Node) -> None:
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGSTOP)

    def resume(self, node: Node) -> None:
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGCONT)

    def stop(self, node: Node) -> None:
        if node.proc is None or node.proc.poll() is not None:
            return
        os.kill(node.proc.pid, signal.SIGCONT)
        node.proc.send_signal(signal.SIGTERM)
        try:
            node.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill9(node)

    def stop_all(self) -> None:
        for node in self.nodes:
            self.stop(node)

    def wipe(self, node: Node) -> None:
        shutil.rmtree(node.root, ignore_errors=True)

    def leader(self, timeout_s: float = 20.0) -> Node:
        """The node that answers a read itself (the others say NotLeader)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc is None or node.proc.poll() is not None:
                    continue
                with Client(node.endpoint, timeout=2.0) as one:
                    try:
                        one.list_queues()
                        if one.target == node.endpoint:
                            return node
                    except QueueError:
                        pass
            time.sleep(0.1)
        raise AssertionError("no leader")

    def digests(self) -> list[tuple[str, int]]:
        """(digest of the whole keyspace, applied index) of every stopped node's replica."""
        out = []
        for node in self.nodes:
            store = RocksStore(str(node.root / "shard-0" / "db"))
            try:
                from sqsq.core import keys, records

                h = hashlib.sha256()
                for k, v in store.scan(b"\x00", b"\xff"):
                    h.update(len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v)
                meta = records.Meta.decode(store.get(keys.META_KEY))
                out.append((h.hexdigest(), meta.applied_index))
            finally:
                store.close()
        return out

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.root.glob("*.log")))


def wide_gateway(cluster: LocalCluster, partitions: int) -> Iterator[GatewayProcess]:
    """A second gateway on a running ``LocalCluster``, giving the queues it creates
    ``partitions`` partitions; stopped, by pid, when the generator is closed (a fixture's
    body: ``yield from wide_gateway(cluster, 4)``)."""
    gw = GatewayProcess()
    gw.proc = cluster._spawn("gateway-wide", [  # noqa: SLF001 - the harness's own spawner
        "gateway", "--etcd", cluster.etcd.endpoint, "--host", "127.0.0.1",
        "--grpc-port", str(gw.grpc_port), "--http-port", str(gw.http_port),
        "--partitions", str(partitions)])
    try:
        wait_for_port(gw.grpc_port, gw.proc)
        yield gw
    finally:
        cluster.terminate(gw.proc)


def drain(client: Client, queue: str, *, idle_receives: int = 3) -> list[str]:
    """Every body still in ``queue``, received and deleted (in batches) until it answers
    empty a few times in a row."""
    bodies: list[str] = []
    empty = 0
    while empty < idle_receives:
        got = client.receive_message(queue, max_number_of_messages=10, wait_time_seconds=1,
                                     visibility_timeout=60)
        if not got:
            empty += 1
            continue
        empty = 0
        bodies += [m.body for m in got]
        deleted = client.delete_message_batch(queue, receipt_entries(got))
        assert not deleted.failed, deleted.failed
    return bodies


def receipt_entries(messages: list) -> list[dict[str, str]]:
    """A DeleteMessageBatch's entries for ``messages``."""
    return [{"Id": str(i), "ReceiptHandle": m.receipt_handle} for i, m in enumerate(messages)]
