"""A port that cannot be bound stops the process at once, with one line naming the port and
what it is for, before anything is half started (checked before any server binds)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clusterup import sqsq
from serverproc import free_port
from sqsq.cli.localprocs import free_port_range


@contextmanager
def listening(port: int) -> Iterator[None]:
    """Another process's server on ``port`` (as gRPC and aiohttp bind)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        yield


def _one_error_line(out) -> str:  # noqa: ANN001
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_a_node_whose_raft_port_is_taken_stops_at_once_naming_it(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"s" * 32)
    raft = free_port_range(4)
    with listening(raft):
        out = sqsq("node", "--etcd", f"127.0.0.1:{free_port()}", "--node-id", "n1",
                   "--data-dir", str(tmp_path / "n1"), "--grpc-port", str(free_port()),
                   "--raft-port", str(raft), "--shards", "4",
                   "--secret-file", str(tmp_path / "secret"), timeout_s=30)
    assert _one_error_line(out) == (f"sqsq node: error: port {raft} on 127.0.0.1 (Raft) is "
                                    "in use by another process")


def test_a_gateway_whose_http_or_metrics_port_is_taken_stops_naming_it() -> None:
    http, metrics = free_port(), free_port()
    with listening(http):
        out = sqsq("gateway", "--etcd", f"127.0.0.1:{free_port()}", "--grpc-port",
                   str(free_port()), "--http-port", str(http), timeout_s=30)
    assert f"port {http} on 127.0.0.1 (SQS HTTP) is in use" in _one_error_line(out)
    with listening(metrics):
        out = sqsq("server", "--data-dir", "unused", "--grpc-port", str(free_port()),
                   "--http-port", str(free_port()), "--metrics-port", str(metrics),
                   timeout_s=30)
    assert f"port {metrics} on 127.0.0.1 (metrics and health) is in use" in \
        _one_error_line(out)


def test_cluster_up_names_a_port_given_twice_or_in_use(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    base = free_port_range(12)  # each node: gRPC, metrics, two Raft ports
    layout = {
        "format": 1, "shards": 2, "partitions": 1,
        "nodes": [{"id": f"n{i + 1}", "grpc_port": base + 4 * i,
                   "metrics_port": base + 4 * i + 1, "raft_port": base + 4 * i + 2}
                  for i in range(3)],
        "etcd": {"client_port": free_port(), "peer_port": free_port()},
        "gateway": {"grpc_port": free_port(), "http_port": free_port(),
                    "metrics_port": free_port()}}
    # n1's Raft port is n2's gRPC port
    layout["nodes"][1]["grpc_port"] = layout["nodes"][0]["raft_port"]
    (root / "cluster.json").write_text(json.dumps(layout))
    assert _one_error_line(sqsq("cluster", "up", "--dir", str(root), timeout_s=30)) == (
        f"sqsq cluster up: error: port {layout['nodes'][0]['raft_port']} is given twice: "
        "for n1 Raft and for n2 gRPC")
    layout["nodes"][1]["grpc_port"] = free_port()
    (root / "cluster.json").write_text(json.dumps(layout))
    with listening(layout["etcd"]["client_port"]):
        line = _one_error_line(sqsq("cluster", "up", "--dir", str(root), timeout_s=30))
    assert line == (f"sqsq cluster up: error: port {layout['etcd']['client_port']} on "
                    "127.0.0.1 (etcd client) is in use by another process")


def test_the_gateway_ports_given_are_never_picked_for_another_member(tmp_path: Path,
                                                                       monkeypatch) -> None:  # noqa: ANN001
    """`cluster up --http-port P` picks the other members' ports itself: with P the first
    candidate of every pick, etcd once got P too and the cluster refused to start."""
    from sqsq.cli import localprocs
    from sqsq.cli.cluster import LocalCluster

    grpc, http = free_port(), free_port()
    candidates = iter([http, grpc] * 3 + list(range(http + 1, http + 2000)))
    monkeypatch.setattr(localprocs, "_candidate", lambda count: next(candidates))
    monkeypatch.setattr(localprocs, "_HANDED_OUT", localprocs.deque(maxlen=4096))
    c = LocalCluster(tmp_path / "c", nodes=3, shards=2, etcd_members=3,
                     gateway_grpc_port=grpc, gateway_http_port=http)
    picked = [p for e in c.etcds for p in (e.client_port, e.peer_port)]
    picked += [p for n in c.nodes for p in (n.grpc_port, n.metrics_port, n.raft_port,
                                             n.raft_port + 1)]
    assert grpc not in picked and http not in picked, picked
    assert (c.gateway.grpc_port, c.gateway.http_port) == (grpc, http)
