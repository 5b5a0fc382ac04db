"""A real server, a known workload, two exports through the Admin RPC, one Spark session.

The workload (no sleeps: visibility 0 makes a receive count without waiting, long delays and
visibility timeouts keep DELAYED and IN_FLIGHT stable for the test's lifetime):

    jobs      5 visible, 2 delayed (600 s), 2 of the visible received for 300 s -> in flight
    orders    redrive to dlq, maxReceiveCount=1: 3 sent (groups a, a, b), received with
              visibility 0, received again -> all 3 dead-lettered; then 1 more sent (visible)
    billing   redrive to dlq, maxReceiveCount=1: 1 sent (group c) -> dead-lettered
    dlq       4 dead-lettered; 1 of them received for 300 s (in flight, receive count 2)

Snapshot 1, then: 4 more sends to jobs, one in-flight jobs message deleted, the orders
message received and deleted. Snapshot 2, then the server stops.

The slow setups that need no Spark session (this workload, the cluster and the Spark
standalone master and workers of test_cluster_reports, the export of test_first_report) are
begun as the first analytics test starts (``head_start``), if a selected test uses them, one
after the other on a thread: the local Spark that test starts keeps about one of the two
cores busy, the other does these.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from analytics.sparkstandalone import SparkStandalone
from analytics.support import ARN, CLUSTER_SHARDS, REPO, HeadStart, Workload
from serverproc import ServerProcess
from sqsq.analytics.export import export_endpoint
from sqsq.cli import export as export_cli
from sqsq.cli.cluster import LocalCluster
from sqsq.client import Client
from sqsq.control.balance import ENV_BUSY_AT

sys.path.insert(0, str(REPO / "spark_jobs"))  # the jobs import their sibling `common`


def _redrive(max_receive_count: int) -> dict[str, str]:
    policy = {"deadLetterTargetArn": ARN + "dlq", "maxReceiveCount": max_receive_count}
    return {"RedrivePolicy": json.dumps(policy)}


def _attr(value: str) -> dict[str, dict[str, str]]:
    return {"kind": {"DataType": "String", "StringValue": value}}


def run_workload(c: Client) -> dict[str, object]:
    c.create_queue("dlq")
    c.create_queue("jobs")
    c.create_queue("orders", attributes=_redrive(1))
    c.create_queue("billing", attributes=_redrive(1))
    for i in range(5):
        c.send_message("jobs", f"job-{i}")
    for i in range(2):
        c.send_message("jobs", f"later-{i}", delay_seconds=600)
    held = c.receive_message("jobs", max_number_of_messages=2, visibility_timeout=300)
    assert len(held) == 2
    for group, kind in (("tenant-a", "bad"), ("tenant-a", "timeout"), ("tenant-b", "bad")):
        c.send_message("orders", f"order-{kind}", message_group_id=group,
                       message_attributes=_attr(kind))
    assert len(c.receive_message("orders", max_number_of_messages=10, visibility_timeout=0)) == 3
    assert c.receive_message("orders", max_number_of_messages=10, visibility_timeout=0) == []
    c.send_message("orders", "order-fresh")
    c.send_message("billing", "bill", message_group_id="tenant-c", message_attributes=_attr("bad"))
    assert len(c.receive_message("billing", max_number_of_messages=1, visibility_timeout=0)) == 1
    assert c.receive_message("billing", max_number_of_messages=1, visibility_timeout=0) == []
    in_dlq = c.receive_message("dlq", max_number_of_messages=1, visibility_timeout=300)
    assert len(in_dlq) == 1
    return {"held": held, "dlq_in_flight": in_dlq[0].message_id}


def between_snapshots(c: Client, held: list) -> None:
    for i in range(4):
        c.send_message("jobs", f"job-more-{i}")
    c.delete_message("jobs", held[0].receipt_handle)
    got = c.receive_message("orders", max_number_of_messages=1, visibility_timeout=300)
    assert len(got) == 1
    c.delete_message("orders", got[0].receipt_handle)


def make_workload(root: Path) -> Workload:
    """The workload above and its two exports; the server is stopped when it returns."""
    srv = ServerProcess(root / "data").start()
    w = Workload(root / "export", root / "data", srv)
    try:
        with Client(srv.endpoint) as c:
            state = run_workload(c)
            w.dlq_in_flight_id = str(state["dlq_in_flight"])
            w.snapshots.append(export_endpoint(srv.endpoint, w.export_dir)["snapshot_ms"])
            from sqsq.analytics.export import ExportError, export_data_dir

            try:  # a running server holds the store: the export must say to use --endpoint
                export_data_dir(w.data_dir, root / "never")
            except ExportError as e:
                w.locked_error = str(e)
            between_snapshots(c, state["held"])  # type: ignore[arg-type]
            # the second export goes through the CLI entry point the `sqsq` command wires in
            parser = argparse.ArgumentParser()
            export_cli.add_parser(parser.add_subparsers())
            args = parser.parse_args(["export", "--out", str(w.export_dir),
                                      "--endpoint", srv.endpoint])
            assert export_cli.run(args) == 0
            manifest = json.loads((w.export_dir / "manifest.json").read_text())
            w.snapshots.append(manifest["snapshots"][-1]["snapshot_ms"])
    finally:
        srv.stop()
    return w


def make_first_export(root: Path) -> Path:
    """test_first_report's: `make run` and a few sends, one snapshot, nothing dead-lettered."""
    srv = ServerProcess(root / "data").start()
    try:
        with Client(srv.endpoint) as c:
            c.create_queue("dlq")
            c.create_queue("work", attributes=_redrive(3))
            c.send_message("work", "the only message")
            export_endpoint(srv.endpoint, root / "export")
    finally:
        srv.stop()
    return root / "export"


@pytest.fixture(scope="session", autouse=True)
def head_start(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeadStart]:
    """The slow setups no Spark session is needed for, begun with the first analytics test
    if a selected test uses them, one after the other on a thread, while that test starts
    the local Spark (whose JVM then keeps about one of the two cores busy)."""
    starts = HeadStart()

    def workload() -> Workload:
        return make_workload(tmp_path_factory.mktemp("analytics"))

    def cluster() -> LocalCluster:  # test_cluster_reports's: two shards, two partitions a queue
        # every node says it is busy, so that a queue's sends take both partitions (they stay
        # on the queue's home partition while its leader keeps up)
        return LocalCluster(tmp_path_factory.mktemp("acluster"), nodes=3,
                            shards=CLUSTER_SHARDS, partitions=CLUSTER_SHARDS,
                            env={**os.environ, ENV_BUSY_AT: "0"}).start()

    def standalone() -> SparkStandalone:  # no Java: the tests that use it fail
        return SparkStandalone(tmp_path_factory.mktemp("spark"), workers=2).start()

    starts.plan("workload", workload, lambda w: shutil.rmtree(w.export_dir.parent,
                                                              ignore_errors=True))
    starts.plan("cluster", cluster, LocalCluster.stop)
    starts.plan("standalone", standalone, SparkStandalone.stop)
    starts.plan("first_export", lambda: make_first_export(tmp_path_factory.mktemp("first")),
                lambda _: None)
    here = Path(__file__).resolve().parent
    used = {name for item in request.session.items if here in item.path.resolve().parents
            for name in getattr(item, "fixturenames", ())}
    try:
        # in the order the tests need them
        for name in ("workload", "cluster", "standalone", "first_export"):
            if name in used:
                starts.begin(name)
        yield starts
    finally:
        starts.close()


@pytest.fixture(scope="session")
def workload(head_start: HeadStart) -> Workload:
    return head_start.result("workload")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local Spark for every analytics test. No Java is a failure, not a skip."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Java is required for the Spark analytics tests (install a JDK 17)")
    import common

    session = common.build_session("sqsq-analytics-tests", "local[2]")
    yield session
    session.stop()
