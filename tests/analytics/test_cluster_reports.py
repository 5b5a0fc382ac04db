"""Analytics over a cluster: ``sqsq export --endpoint GATEWAY`` snapshots every shard from its
leader into one export (a ``shard=`` partition each), and both Spark reports run over it on a
Spark standalone cluster (a master and two workers, ``--master spark://...``).

The cluster (etcd, three nodes, two shards) is started the way ``sqsq cluster up`` starts
one, with a gateway giving every new queue two partitions, one on each shard. The workload,
through the gateway:

    work   13 sent, then all received for 600 s (in flight); the receipt handles name the
           shard that holds each message: the truth the per-shard figures are checked against
    fail   redrive to dlq, maxReceiveCount=1: 4 sent, received with visibility 0 until the
           receives come back empty -> all 4 dead-lettered, each on its own partition's shard
    dlq    those 4 (received after the export, to learn their shards)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from analytics.sparkstandalone import SparkStandalone
from analytics.support import ARN, CLUSTER_SHARDS, REPO, HeadStart, by, export_rows, table_rows
from listening import listening
from sqsq import admincred
from sqsq.cli.cluster import LocalCluster
from sqsq.client import Client
from sqsq.core.receipts import shard_of_receipt_handle
from sqsq.gateway.auth import ERROR_CODE_KEY
from sqsq.v1 import admin_pb2, admin_pb2_grpc
from sqsq.wire import SendSpread

SHARDS = CLUSTER_SHARDS
WORK = 13  # odd: the two shards' figures differ, so a swapped shard id would show
FAILING = 4
JOBS = ("backlog_report", "dlq_analytics")


@dataclass
class Exported:
    out: Path
    snapshot_ms: int
    work_by_shard: Counter
    dlq_by_shard: Counter


@pytest.fixture(scope="module")
def cluster(head_start: HeadStart) -> Iterator[LocalCluster]:
    """Three nodes, SHARDS shards, SHARDS partitions a queue; started with the first analytics
    test (conftest's head_start), stopped at the end of this module."""
    c = head_start.result("cluster")
    yield c
    c.stop()


def _receive_all(c: Client, queue: str, n: int, visibility_timeout: int) -> list:
    got: list = []
    for _ in range(50):  # each receive answers from one partition
        got += c.receive_message(queue, max_number_of_messages=10,
                                 visibility_timeout=visibility_timeout)
        if len(got) >= n:
            return got
    raise AssertionError(f"{len(got)} of {n} messages of {queue} received")


def _dead_letter_all(c: Client, queue: str) -> None:
    """Receive with visibility 0 until nothing comes back: with maxReceiveCount=1 the
    receive after a message's first one moves it to the dead-letter queue."""
    for _ in range(50):
        if not c.receive_message(queue, max_number_of_messages=10, visibility_timeout=0):
            return
    raise AssertionError(f"{queue} kept answering messages")


@pytest.fixture(scope="module")
def exported(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    out = tmp_path_factory.mktemp("cluster-export")
    with Client(cluster.gateway.endpoint, timeout=30) as c:
        # Sends take the partitions call by call here, so that both shards hold messages (the
        # SDK, like the gateway, sends a burst of calls made close together to one partition,
        # and spreads them past the queue's home partition only while its leader is busy:
        # this cluster's nodes all say they are).
        c._routes.sends = SendSpread(calls=1)
        c.create_queue("dlq")
        policy = {"deadLetterTargetArn": ARN + "dlq", "maxReceiveCount": 1}
        c.create_queue("fail", attributes={"RedrivePolicy": json.dumps(policy)})
        c.create_queue("work")
        for i in range(WORK):
            c.send_message("work", f"work-{i}")
        for i in range(FAILING):
            c.send_message("fail", f"fail-{i}")
        work = _receive_all(c, "work", WORK, 600)
        _dead_letter_all(c, "fail")
        run = subprocess.run(
            [sys.executable, "-m", "sqsq.cli.main", "export", "--out", str(out),
             "--endpoint", cluster.gateway.endpoint],
            capture_output=True, text=True, cwd=REPO, env=cluster.env, timeout=120)
        assert run.returncode == 0, run.stderr
        dead = _receive_all(c, "dlq", FAILING, 600)
    manifest = json.loads((out / "manifest.json").read_text())
    return Exported(out, manifest["snapshots"][-1]["snapshot_ms"],
                    Counter(shard_of_receipt_handle(m.receipt_handle) for m in work),
                    Counter(shard_of_receipt_handle(m.receipt_handle) for m in dead))


def test_every_queue_has_a_partition_on_each_shard(cluster: LocalCluster,
                                                   exported: Exported) -> None:
    placed = {q["name"]: sorted(q["partitions"]) for q in cluster.status()["queues"]}
    assert placed == {"dlq": [0, 1], "fail": [0, 1], "work": [0, 1]}
    # the sends reached both partitions: the test below sees two loaded shards
    assert set(exported.work_by_shard) == {0, 1} and set(exported.dlq_by_shard) == {0, 1}
    assert exported.work_by_shard[0] != exported.work_by_shard[1]


def test_export_through_the_gateway_has_every_shard(cluster: LocalCluster,
                                                    exported: Exported) -> None:
    manifest = json.loads((exported.out / "manifest.json").read_text())
    (entry,) = manifest["snapshots"]
    assert entry["source"] == f"endpoint {cluster.gateway.endpoint}"
    assert [s["shard"] for s in entry["shards"]] == [0, 1]
    assert sum(s["messages"] for s in entry["shards"]) == WORK + FAILING
    messages = export_rows(exported.out, "messages", exported.snapshot_ms)
    per = Counter((r["queue_name"], r["shard"]) for r in messages)
    for shard in range(SHARDS):
        assert per[("work", shard)] == exported.work_by_shard[shard]
        assert per[("dlq", shard)] == exported.dlq_by_shard[shard]
        assert per[("fail", shard)] == 0
    queues = Counter(r["queue_name"] for r in export_rows(exported.out, "queues",
                                                          exported.snapshot_ms))
    assert queues == {"dlq": SHARDS, "fail": SHARDS, "work": SHARDS}  # one row per partition
    # every checkpoint was released on the node that made it
    for node in cluster.nodes:
        left = list((node.root / "snapshots").glob("*/shard-*"))
        assert left == [], left


def _admin_error(endpoint: str, request: admin_pb2.CreateSnapshotRequest | None = None,
                 delete: str | None = None) -> grpc.RpcError:
    with admincred.signing(grpc.insecure_channel(endpoint)) as channel:  # the env's
        admin = admin_pb2_grpc.AdminStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            if delete is not None:
                admin.DeleteSnapshot(admin_pb2.DeleteSnapshotRequest(path=delete), timeout=10)
            else:
                admin.CreateSnapshot(request, timeout=10)
    return info.value


def test_only_the_leader_snapshots_a_shard(cluster: LocalCluster) -> None:
    for _ in range(10):
        status = cluster.status()
        grpc_of = {n["id"]: n["grpc"] for n in status["nodes"]}
        shard = next(s for s in status["shards"] if s["id"] == 0)
        follower = next(n for n in shard["replicas"] if n != shard["leader"])
        with admincred.signing(grpc.insecure_channel(grpc_of[follower])) as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            try:
                made = admin.CreateSnapshot(admin_pb2.CreateSnapshotRequest(shard_ids=[0]),
                                            timeout=10)
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.UNAVAILABLE
                assert dict(err.trailing_metadata())[ERROR_CODE_KEY] == "NotLeader"
                assert err.details().endswith(f"leader={grpc_of[shard['leader']]}")
                break
            # It led after all: the map's leader hint lagged a leadership change (an election
            # on a loaded machine, or the leaders being spread). Its hint must follow.
            for snap in made.snapshots:
                admin.DeleteSnapshot(admin_pb2.DeleteSnapshotRequest(path=snap.path), timeout=10)
        _hint_names(cluster, 0, follower)
    else:
        raise AssertionError("shard 0's leadership kept moving")
    # the gateway releases only checkpoints it made, on the node that made them
    err = _admin_error(cluster.gateway.endpoint, delete="/etc/passwd")
    assert err.code() == grpc.StatusCode.NOT_FOUND


def _hint_names(cluster: LocalCluster, shard_id: int, node: str, timeout_s: float = 10.0) -> None:
    """Wait until the map's leader hint for ``shard_id`` is no longer older than ``node``'s
    leadership (it names ``node``, or a leader elected since)."""
    deadline = time.monotonic() + timeout_s
    first = None
    while time.monotonic() < deadline:
        shard = next(s for s in cluster.status()["shards"] if s["id"] == shard_id)
        first = first or shard["leader"]
        if shard["leader"] == node or shard["leader"] != first:
            return
        time.sleep(0.1)
    raise AssertionError(f"shard {shard_id} answered as leader on {node}, but the map still "
                         f"names {first}")


@pytest.fixture(scope="module")
def standalone(head_start: HeadStart) -> Iterator[SparkStandalone]:
    """A master and two workers, started with the first analytics test (conftest's
    head_start), stopped at the end of this module."""
    spark = head_start.result("standalone")
    yield spark
    spark.stop()


def test_the_spark_daemons_listen_on_127_0_0_1_and_the_master_on_its_own_ports(
        standalone: SparkStandalone) -> None:
    master, *workers = standalone.procs
    # no REST submission server (on by default since Spark 4.1, at the fixed port 6066)
    assert sorted(listening(master.pid)) == sorted(
        [("127.0.0.1", standalone.port), ("127.0.0.1", standalone.webui_port)])
    for worker in workers:
        found = listening(worker.pid)
        assert found and {a for a, _ in found} == {"127.0.0.1"}


def test_both_reports_on_a_spark_standalone_cluster(
        standalone: SparkStandalone, exported: Exported, tmp_path: Path) -> None:
    # side by side, as two users would submit them: each takes an executor on each worker
    logs = {job: tmp_path / f"{job}.log" for job in JOBS}
    procs: dict[str, subprocess.Popen] = {}
    try:
        for job, log_path in logs.items():
            with open(log_path, "w") as log:
                procs[job] = subprocess.Popen(
                    [sys.executable, str(REPO / "spark_jobs" / f"{job}.py"),
                     "--input", str(exported.out), "--out", str(tmp_path / job),
                     "--master", standalone.master_url],
                    stdout=subprocess.DEVNULL, stderr=log, cwd=REPO, env=standalone.driver_env())
        codes = {job: proc.wait(timeout=300) for job, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for job, code in codes.items():
        assert code == 0, logs[job].read_text()[-4000:]

    # both ran on the standalone cluster, with an executor on each worker
    apps = {a["name"]: a["id"] for a in standalone.state()["completedapps"]}
    assert {"sqsq-backlog-report", "sqsq-dlq-analytics"} <= set(apps)
    for work_dir in standalone.worker_dirs:
        assert {apps["sqsq-backlog-report"], apps["sqsq-dlq-analytics"]} <= {
            p.name for p in work_dir.iterdir()}

    backlog = tmp_path / "backlog_report"
    expected = exported.work_by_shard + exported.dlq_by_shard
    shards = by(table_rows(backlog, "shard_load"), "shard")
    assert sorted(shards) == [0, 1]
    assert {s: r["messages"] for s, r in shards.items()} == {s: expected[s] for s in (0, 1)}
    assert sum(r["messages"] for r in shards.values()) == WORK + FAILING
    assert sum(r["share"] for r in shards.values()) == pytest.approx(1.0)
    parts = by(table_rows(backlog, "partition_load"), "queue_name", "shard")
    assert sorted(parts) == [(q, s) for q in ("dlq", "fail", "work") for s in (0, 1)]
    for shard in (0, 1):
        assert parts[("work", shard)]["messages"] == exported.work_by_shard[shard]
        assert parts[("work", shard)]["share_of_queue"] == pytest.approx(
            exported.work_by_shard[shard] / WORK)
        assert parts[("dlq", shard)]["messages"] == exported.dlq_by_shard[shard]
        assert parts[("fail", shard)]["messages"] == 0  # an idle partition is listed too
    assert {r["partitions"] for r in parts.values()} == {2}
    # a queue counts once however many partitions it has
    queues = by(table_rows(backlog, "queue_backlog"), "queue_name")
    assert {n: (r["total"], r["in_flight"], r["visible"]) for n, r in queues.items()} == {
        "work": (WORK, WORK, 0), "dlq": (FAILING, 0, FAILING), "fail": (0, 0, 0)}
    assert queues["dlq"]["is_dead_letter_queue"]
    overall = table_rows(backlog, "overall_backlog")[0]
    assert (overall["queues"], overall["total"]) == (3, WORK + FAILING)
    summary = (backlog / "summary.md").read_text()
    assert f"**3 queues, {WORK + FAILING} messages**" in summary
    assert "## Partitions" in summary and "shard_balance.png" in summary

    dlq = tmp_path / "dlq_analytics"
    (overview,) = table_rows(dlq, "dlq_overview")
    assert (overview["dlq_name"], overview["messages"], overview["sources"]) == (
        "dlq", FAILING, "fail")
    (source,) = table_rows(dlq, "dlq_by_source")
    assert (source["source_queue"], source["messages"], source["source_exists"]) == (
        "fail", FAILING, True)
    candidates = table_rows(dlq, "redrive_candidates")
    assert Counter(r["shard"] for r in candidates) == exported.dlq_by_shard
