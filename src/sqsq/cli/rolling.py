"""``sqsq cluster restart --rolling``: every node of a local cluster restarted in turn.

The running ``sqsq cluster up`` owns the processes, so ``cluster restart`` asks it (it writes
``DIR/restart-request.json`` and sends SIGUSR1; ``up`` writes its progress to
``DIR/restart.json``). Each node is stopped with SIGTERM and started again on the same ports
and data. The next node is always one leading no shard while one is left, so leaders go last
(by then the others are fresh: a stopping leader hands each shard to a caught-up follower,
``ShardEngine.hand_over``, and the SDK's retries cover the moment that takes). After each
restart it waits until the node is ready: it is alive in etcd, every shard has a live
leader, each of the node's replicas has applied the commit index its leader reported when
the node came back (``Admin.ReplicaStatus``), and the node's own ``/readyz`` says ready, so
no step starts while a shard is short of an up-to-date replica.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqsq.cli.cluster import LocalCluster
    from sqsq.cli.clusterdir import GatewayProcess, NodeProcess

READY_TIMEOUT_S = 90.0


def rolling_restart(cluster: LocalCluster, *, timeout_s: float = READY_TIMEOUT_S,
                    report: Callable[[dict[str, Any]], None] = lambda step: None
                    ) -> list[dict[str, Any]]:
    """Restart every node once, in turn: the next one is always a node leading no shard
    if one is left, so leaders go last. After each, wait until it is ready
    (``wait_caught_up``). Returns (and ``report``s) one step per node."""
    status = cluster.wait_ready(timeout_s)
    left = list(cluster.nodes)
    steps = []
    while left:
        leaders = {s["leader"] for s in status["shards"]}
        node = min(left, key=lambda n: (n.node_id in leaders, n.node_id))
        left.remove(node)
        started = time.monotonic()
        cluster.terminate(node.proc)
        cluster.start_node(node)
        status = wait_caught_up(cluster, node, timeout_s)
        steps.append({"node": node.node_id, "was_leader": node.node_id in leaders,
                      "seconds": round(time.monotonic() - started, 2)})
        report(steps[-1])
    return steps


def wait_caught_up(cluster: LocalCluster, node: NodeProcess, timeout_s: float = READY_TIMEOUT_S
                   ) -> dict[str, Any]:
    """The status once ``node`` is ready after a restart: it is alive in etcd, every
    shard has a live leader, and each replica of ``node`` has applied the commit index
    its shard's leader reported when first seen after the restart."""
    deadline = time.monotonic() + timeout_s
    targets: dict[int, int] | None = None
    while True:
        try:
            status = cluster.status(replicas=True)
        except Exception:  # noqa: BLE001 - etcd busy or mid-election: look again
            status = None
        if status is not None:
            targets = catch_up_targets(status, node.node_id, targets)
            if targets is not None and caught_up(status, node.node_id, targets) \
                    and process_ready(cluster, node):
                return status
        if time.monotonic() > deadline:
            raise OSError(f"node {node.node_id} was not ready within {timeout_s}s after "
                          f"its restart: {status}")
        time.sleep(0.2)


def catch_up_targets(status: dict[str, Any], node_id: str,
                      targets: dict[int, int] | None) -> dict[int, int] | None:
    """For each shard ``node_id`` holds, the commit index its leader reports (once every
    such shard has a live leader that answered); ``targets`` once known."""
    if targets is not None:
        return targets
    alive = {n["id"] for n in status["nodes"] if n["alive"]}
    found = {}
    for shard in status["shards"]:
        if node_id not in shard["replicas"]:
            continue
        leader = shard["leader"]
        state = next((r for r in status["replicas"].get(leader or "", ())
                      if r["shard"] == shard["id"] and r["leader"]), None)
        if leader not in alive or state is None:
            return None
        found[shard["id"]] = state["commit"]
    return found


def caught_up(status: dict[str, Any], node_id: str, targets: dict[int, int]) -> bool:
    alive = {n["id"] for n in status["nodes"] if n["alive"]}
    mine = {r["shard"]: r for r in status["replicas"].get(node_id, ())}
    return node_id in alive \
        and all(s["leader"] in alive for s in status["shards"]) \
        and all(s in mine and mine[s]["applied"] >= target for s, target in targets.items())


def process_ready(cluster: LocalCluster, node: NodeProcess | GatewayProcess) -> bool:
    """``node_ready`` (a node's or the gateway's), asked from where the placement (if any)
    puts "client", as ``LocalCluster.status`` does: a node in a network namespace of its own
    has an address this process has no route to, and a packet sent there would leave the
    machine."""
    if cluster.placement is None:
        return node_ready(node.metrics_url)
    import subprocess

    from sqsq.cli.localprocs import probe_argv

    argv = cluster.placement.command("client", probe_argv("ready", node.metrics_url, 1))
    return subprocess.run(argv, capture_output=True, timeout=60).returncode == 0


def node_ready(metrics_url: str) -> bool:
    """The node's ``/readyz`` answers 200 (see docs/operations.md for what it checks)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(metrics_url + "/readyz", timeout=1.0) as answer:
            return answer.status == 200
    except (OSError, urllib.error.URLError):
        return False


def read_replicas(nodes: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each live node's replicas (``Admin.ReplicaStatus``) by node id; a node that does not
    answer within a second is left out."""
    import grpc

    from sqsq.cli.backup import admin_channel
    from sqsq.v1 import admin_pb2, admin_pb2_grpc

    out = {}
    for node in nodes:
        if not node["alive"]:
            continue
        with admin_channel(node["grpc"]) as channel:
            try:
                answer = admin_pb2_grpc.AdminStub(channel).ReplicaStatus(
                    admin_pb2.ReplicaStatusRequest(), timeout=1.0)
            except grpc.RpcError:
                continue
        out[node["id"]] = [{"shard": r.shard_id, "leader": r.leader, "term": r.term,
                            "commit": r.commit_index, "applied": r.applied_index}
                           for r in answer.replicas]
    return out


def restart_on_signal() -> Any:
    import threading

    asked = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: asked.set())
    return asked


RESTART_REQUEST = "restart-request.json"  # written by `cluster restart`, then SIGUSR1
RESTART_STATE = "restart.json"  # `cluster up`'s progress on it


def serve_restart(cluster: LocalCluster) -> None:
    """Carry out a rolling restart asked for by ``cluster restart``, writing its progress."""
    try:
        request_id = json.loads((cluster.root / RESTART_REQUEST).read_text())["id"]
    except (OSError, ValueError, KeyError):
        return
    state: dict[str, Any] = {"id": request_id, "state": "running", "steps": []}

    def write() -> None:
        tmp = cluster.root / (RESTART_STATE + ".tmp")
        tmp.write_text(json.dumps(state) + "\n")
        os.replace(tmp, cluster.root / RESTART_STATE)

    def step(done: dict[str, Any]) -> None:
        print(f"sqsq cluster: restarted {done['node']}"
              f"{' (a leader)' if done['was_leader'] else ''}, ready in {done['seconds']} s",
              flush=True)
        state["steps"].append(done)
        write()

    write()
    print("sqsq cluster: rolling restart", flush=True)
    try:
        cluster.rolling_restart(report=step)
        state["state"] = "done"
    except OSError as exc:
        state.update(state="failed", error=str(exc))
        print(f"sqsq cluster: rolling restart failed: {exc}", flush=True)
    cluster.write_json()  # the nodes' new pids
    write()


def cmd_restart(args: argparse.Namespace) -> int:
    import secrets

    try:
        info = json.loads((args.dir / "cluster.json").read_text())
        pid = info.get("supervisor_pid")
        if not pid:
            raise OSError("it was not written by `sqsq cluster up`")
        request_id = secrets.token_hex(8)
        tmp = args.dir / (RESTART_REQUEST + ".tmp")
        tmp.write_text(json.dumps({"id": request_id}) + "\n")
        os.replace(tmp, args.dir / RESTART_REQUEST)
        os.kill(pid, signal.SIGUSR1)
    except (OSError, ValueError) as exc:
        print(f"sqsq cluster restart: error: no running `sqsq cluster up` for {args.dir}: "
              f"{exc}", file=sys.stderr)
        return 1
    deadline = time.monotonic() + READY_TIMEOUT_S * (len(info["nodes"]) + 1)
    shown = 0
    while time.monotonic() < deadline:
        try:
            state = json.loads((args.dir / RESTART_STATE).read_text())
        except (OSError, ValueError):
            state = {}
        if state.get("id") == request_id:
            for step in state["steps"][shown:]:
                print(f"restarted {step['node']}{' (a leader)' if step['was_leader'] else ''}"
                      f": ready in {step['seconds']} s", flush=True)
            shown = len(state["steps"])
            if state["state"] == "done":
                print(f"rolling restart done: {shown} nodes")
                return 0
            if state["state"] == "failed":
                print(f"sqsq cluster restart: error: {state.get('error')}", file=sys.stderr)
                return 1
        try:
            os.kill(pid, 0)
        except OSError:
            print("sqsq cluster restart: error: `sqsq cluster up` exited", file=sys.stderr)
            return 1
        time.sleep(0.2)
    print("sqsq cluster restart: error: no answer from `sqsq cluster up` in time",
          file=sys.stderr)
    return 1
