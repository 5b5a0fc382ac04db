"""What each extra shard costs: CPU per process, idle and under a load.

    python -m bench.shardcost [--shards 1,4] [--duration 5] [--settle 0] [--idle-only]
                              [--workload send-10x100B]

For each shard count, starts a cluster as ``sqsq cluster up`` does (etcd, three nodes, a
gateway, a queue with one partition per shard) and reads every process's CPU time from
``/proc/<pid>/stat``: first over an idle window (Raft heartbeats, tickers, leases), then
over a window of the bench's workload ``--workload`` (``send-10x100B`` by default;
``send-c1``, one send at a time, shows what the extra shards cost a lone call;
``--idle-only``: the idle window alone). ``--settle S`` waits S seconds after the cluster is
up before the idle window, so that it measures shards that have gone quiet rather than their
first elections and sweeps. It prints CPU seconds per wall second for each role (gateway,
nodes, etcd, the load's client processes, everything on the machine) and, under load, CPU
milliseconds, Raft log entries (all shards together) and SQS calls the nodes answered per
1,000 messages sent, the commands per entry of the shard leaders' group commit (from the
nodes' /metrics), and the nodes' read and write system calls per 1,000 messages (their peer
frames and client replies, from ``/proc/<pid>/io``). On 2 cores the machine is the limit,
so what the extra shards cost shows up as CPU per message.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from bench.runner import run_workload
from bench.workloads import catalogue, select
from sqsq import admincred
from sqsq.cli.cluster import LocalCluster
from sqsq.v1 import admin_pb2, admin_pb2_grpc

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (its threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _syscalls(pids: list[int]) -> Counter[str]:
    """Read and write system calls (``/proc/<pid>/io``: syscr, syscw) of these processes,
    summed: a node's socket reads and writes, its log's pwrites and fdatasyncs are not
    counted by syscw, but its peer frames and replies are (on loopback most of a send's
    cost)."""
    out: Counter[str] = Counter()
    for pid in pids:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("syscr", "syscw"):
                    out[key] += int(value)
    return out


def _applied_indexes(endpoint: str) -> dict[int, int]:
    """Each shard's applied Raft index, from the Admin snapshot the export uses (the
    checkpoints are released at once)."""
    with admincred.signing(grpc.insecure_channel(endpoint)) as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        resp = admin.CreateSnapshot(admin_pb2.CreateSnapshotRequest(), timeout=60)
        for s in resp.snapshots:
            admin.DeleteSnapshot(admin_pb2.DeleteSnapshotRequest(path=s.path), timeout=60)
    return {s.shard_id: s.applied_index for s in resp.snapshots}


def _node_counts(cluster: LocalCluster) -> Counter[str]:
    """From every node's /metrics: the commands its shard leaders proposed and the log
    entries that carried them (group commit), and the SQS calls it answered."""
    counts: Counter[str] = Counter()
    for node in cluster.nodes:
        with urllib.request.urlopen(node.metrics_url + "/metrics", timeout=10) as resp:  # noqa: S310 - our own node
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "sqsq_raft_group_commit_commands_sum":
                    counts["commands"] += sample.value
                elif sample.name == "sqsq_raft_group_commit_commands_count":
                    counts["entries proposed"] += sample.value
                elif sample.name == "sqsq_requests_total" and \
                        sample.labels.get("action") != "CreateQueue":
                    counts["calls"] += sample.value
    return counts


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent not idle."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return (sum(vals[:8]) - idle) / TICK


def _roles(cluster: LocalCluster) -> dict[str, list[int]]:
    return {
        "gateway": [cluster.gateway.proc.pid],
        "nodes": [n.proc.pid for n in cluster.nodes],
        "etcd": [cluster.etcd.proc.pid],
    }


def _sample(roles: dict[str, list[int]]) -> dict[str, float]:
    out = {role: sum(_cpu_s(p) for p in pids) for role, pids in roles.items()}
    out["machine"] = _machine_busy_s()
    return out


def _window(roles: dict[str, list[int]], run: Any) -> tuple[dict[str, float], float, Any]:
    before, t0 = _sample(roles), time.monotonic()
    result = run()
    after, wall = _sample(roles), time.monotonic() - t0
    used = {role: after[role] - before[role] for role in before}
    used["clients"] = max(0.0, used["machine"] - sum(
        v for k, v in used.items() if k != "machine"))
    return used, wall, result


def measure(shards: int, duration_s: float, settle_s: float = 0.0,
            idle_only: bool = False, workload: str = "send-10x100B") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sqsq-shardcost-") as tmp:
        env = dict(os.environ, SQSQ_LOG_LEVEL="WARNING")
        cluster = LocalCluster(Path(tmp), nodes=3, shards=shards, partitions=shards,
                               env=env).start()
        admincred.use_directory(Path(tmp))  # the Admin calls prove the cluster's credential
        try:
            roles = _roles(cluster)
            time.sleep(settle_s)
            idle, idle_wall, _ = _window(roles, lambda: time.sleep(duration_s))
            if idle_only:
                return {"shards": shards,
                        "idle_cpu_per_s": {k: round(v / idle_wall, 3) for k, v in idle.items()}}
            spec = {"kind": "sqsq-grpc", "endpoint": cluster.gateway.endpoint}
            w = select(catalogue(), workload)[0]
            index_before = _applied_indexes(cluster.gateway.endpoint)
            counts_before = _node_counts(cluster)
            calls_before = _syscalls(roles["nodes"])
            busy, busy_wall, result = _window(
                roles, lambda: run_workload(spec, w, duration_s=duration_s))
            calls = _syscalls(roles["nodes"])
            calls.subtract(calls_before)
            counts = _node_counts(cluster)
            counts.subtract(counts_before)
            index_after = _applied_indexes(cluster.gateway.endpoint)
        finally:
            cluster.stop()
    msgs = result["ops"]["send"]["msgs"]
    entries = sum(index_after[s] - index_before.get(s, 0) for s in index_after)
    return {
        "raft_entries_per_1000_msgs": round(1000 * entries / max(msgs, 1), 1),
        "calls_per_1000_msgs": round(1000 * counts["calls"] / max(msgs, 1), 1),
        "commands_per_entry": round(counts["commands"] / max(counts["entries proposed"], 1), 2),
        "node_reads_per_1000_msgs": round(1000 * calls["syscr"] / max(msgs, 1), 1),
        "node_writes_per_1000_msgs": round(1000 * calls["syscw"] / max(msgs, 1), 1),
        "shards": shards,
        "idle_cpu_per_s": {k: round(v / idle_wall, 3) for k, v in idle.items()},
        "load_cpu_per_s": {k: round(v / busy_wall, 3) for k, v in busy.items()},
        "msgs_per_s": result["ops"]["send"]["msgs_per_s"],
        "cpu_ms_per_1000_msgs": {k: round(1000 * v / max(msgs, 1) * 1000, 1)
                                 for k, v in busy.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", default="1,4")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds between the cluster's start and the idle window")
    ap.add_argument("--idle-only", action="store_true", help="no load window")
    ap.add_argument("--workload", default="send-10x100B",
                    help="the bench workload of the load window (a sending one)")
    args = ap.parse_args()
    rows = [measure(int(s), args.duration, args.settle, args.idle_only, args.workload)
            for s in args.shards.split(",")]
    roles = ["gateway", "nodes", "etcd", "clients", "machine"]
    print(f"{'shards':>6}  {'what':<24}" + "".join(f"{r:>9}" for r in roles))
    for row in rows:
        if args.idle_only:
            print(f"{row['shards']:>6}  {'idle CPU s/s':<24}"
                  + "".join(f"{row['idle_cpu_per_s'][r]:>9}" for r in roles))
            continue
        for key, label in (("idle_cpu_per_s", "idle CPU s/s"),
                           ("load_cpu_per_s", f"{args.workload} CPU s/s"),
                           ("cpu_ms_per_1000_msgs", "CPU ms / 1000 msgs")):
            print(f"{row['shards']:>6}  {label:<24}"
                  + "".join(f"{row[key][r]:>9}" for r in roles))
        print(f"{row['shards']:>6}  {args.workload + ' msgs/s':<24}{row['msgs_per_s']:>9}")
        print(f"{row['shards']:>6}  {'Raft entries/1000 msgs':<24}"
              f"{row['raft_entries_per_1000_msgs']:>9}")
        print(f"{row['shards']:>6}  {'SQS calls/1000 msgs':<24}{row['calls_per_1000_msgs']:>9}")
        print(f"{row['shards']:>6}  {'commands per entry':<24}{row['commands_per_entry']:>9}")
        print(f"{row['shards']:>6}  {'node reads/1000 msgs':<24}"
              f"{row['node_reads_per_1000_msgs']:>9}")
        print(f"{row['shards']:>6}  {'node writes/1000 msgs':<24}"
              f"{row['node_writes_per_1000_msgs']:>9}")


if __name__ == "__main__":
    main()
