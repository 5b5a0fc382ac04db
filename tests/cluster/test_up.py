"""``sqsq cluster up`` as users run it: the cluster it starts survives the faults it exists to
show (a kill -9 of a leader, of a follower, of the gateway, of one of its three etcd
members), each reported in one line and started again with ``cluster start-node``; Ctrl-C
stops everything, and a second ``cluster up`` on the same directory is the same cluster, with
its queues and messages.

One cluster (three nodes, four shards, three etcd members: what ``make cluster`` starts) is
shared by the module's tests, in order.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from clusterup import ClusterUp, alive, sqsq, until
from serverproc import free_port
from sqsq.client import Client


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterUp]:
    root = tmp_path_factory.mktemp("up") / "cluster"
    # as `make cluster` starts one (the default shards), on ports of the test's own
    c = ClusterUp(root, "--grpc-port", str(free_port()), "--http-port", str(free_port()))
    c.start()
    assert "3 nodes (n1, n2, n3), 4 shards of three replicas" in c.wait_for("Ctrl-C")
    yield c
    c.stop()


def _boto3(up: ClusterUp):  # noqa: ANN202
    return boto3.client("sqs", endpoint_url=up.http_url, region_name="us-east-1",
                        aws_access_key_id="x", aws_secret_access_key="y",
                        config=Config(retries={"max_attempts": 1}))


def _serves(up: ClusterUp, queue: str, body: str) -> None:
    """A send through the SDK and one through boto3 both go through."""
    with Client(up.endpoint, timeout=30) as c:
        c.send_message(queue, f"{body} (SDK)")
    sqs = _boto3(up)
    url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody=f"{body} (boto3)")


def _kill9(up: ClusterUp, name: str) -> None:
    seen = len(up.output())
    os.kill(up.pid(name), signal.SIGKILL)
    line = up.wait_for(f"{name} killed by SIGKILL", after=seen)
    assert "the others keep serving" in line and f"start-node --dir {up.root} {name}" in line


def _start_node(up: ClusterUp, name: str) -> None:
    before = up.pid(name)
    out = sqsq("cluster", "start-node", "--dir", str(up.root), name)
    assert out.returncode == 0, out.stdout + out.stderr
    assert up.pid(name) != before and alive(up.pid(name))
    until(up.ready, 90, f"{name} back and every shard led")


def test_a_killed_leader_follower_gateway_and_etcd_are_reported_and_started_again(
        up: ClusterUp) -> None:
    queue = "survivor"
    with Client(up.endpoint, timeout=30) as c:
        c.create_queue(queue)
    _serves(up, queue, "before")
    nodes = [n["id"] for n in up.info()["nodes"]]

    leader = until(up.ready, 60, "a leader")["shards"][0]["leader"]
    _kill9(up, leader)
    _serves(up, queue, "leader down")  # the other two elected a leader
    assert sqsq("cluster", "start-node", "--dir", str(up.root), "n9").returncode == 1
    _start_node(up, leader)

    follower = next(n for n in nodes if n != until(up.ready, 60, "a leader")["shards"][0][
        "leader"])
    _kill9(up, follower)
    _serves(up, queue, "follower down")
    _start_node(up, follower)

    _kill9(up, "gateway")
    assert all(alive(up.pid(n)) for n in nodes)  # the rest keeps running
    _start_node(up, "gateway")
    assert [e["name"] for e in up.info()["etcd_members"]] == ["etcd1", "etcd2", "etcd3"]
    _kill9(up, "etcd2")
    _serves(up, queue, "etcd down")
    with Client(up.endpoint, timeout=30) as c:  # the map is writable: two of three members
        c.create_queue("made-while-an-etcd-member-is-down")
    _start_node(up, "etcd2")

    running = sqsq("cluster", "start-node", "--dir", str(up.root), nodes[0])
    assert running.returncode == 1 and f"{nodes[0]} is running" in running.stderr
    assert up.proc is not None and up.proc.poll() is None
    with Client(up.endpoint, timeout=30) as c:
        got = []
        while batch := c.receive_message(queue, 10, wait_time_seconds=1):
            got += [m.body for m in batch]
            for m in batch:
                c.delete_message(queue, m.receipt_handle)
    assert sorted(got) == sorted(f"{what} ({via})" for via in ("SDK", "boto3") for what in (
        "before", "leader down", "follower down", "etcd down"))


def test_ctrl_c_stops_everything_and_up_on_the_same_directory_is_the_same_cluster(
        up: ClusterUp) -> None:
    with Client(up.endpoint, timeout=30) as c:
        c.create_queue("kept")
        c.create_queue("kept.fifo", {"FifoQueue": "true"})
        for i in range(5):
            c.send_message("kept", f"m{i}")
            c.send_message("kept.fifo", f"f{i}", message_group_id="g",
                           message_deduplication_id=str(i))
    before = up.info()
    pids = [before["etcd"]["pid"], before["gateway"]["pid"], *(n["pid"] for n in
                                                                before["nodes"])]
    assert up.interrupt() == 0
    assert "sqsq cluster: stopped" in up.output()
    assert not any(alive(p) for p in pids)
    stopped = sqsq("cluster", "status", "--dir", str(up.root))
    assert stopped.returncode == 1
    assert f"the cluster in {up.root} is not running" in stopped.stderr
    assert "Traceback" not in stopped.stderr and "TRANSIENT" not in stopped.stderr

    up.args = ()  # as a user would type it: the directory says the rest
    up.start()
    assert "started again: 3 nodes (n1, n2, n3), 4 shards" in up.wait_for("Ctrl-C")
    again = up.info()
    for key in ("etcd", "gateway"):
        assert {k: v for k, v in again[key].items() if k != "pid"} == \
            {k: v for k, v in before[key].items() if k != "pid"}
    assert [{k: v for k, v in n.items() if k != "pid"} for n in again["nodes"]] == \
        [{k: v for k, v in n.items() if k != "pid"} for n in before["nodes"]]
    with Client(up.endpoint, timeout=30) as c:
        assert sorted(u.rsplit("/", 1)[1] for u in c.list_queues(queue_name_prefix="kept")) \
            == ["kept", "kept.fifo"]
        fifo = [m.body for m in c.receive_message("kept.fifo", 10, wait_time_seconds=5)]
        assert fifo == [f"f{i}" for i in range(5)]
        std = []
        while batch := c.receive_message("kept", 10, wait_time_seconds=1):
            std += [m.body for m in batch]
        assert sorted(std) == [f"m{i}" for i in range(5)]


def _up_error(root: Path, *args: str) -> str:
    out = sqsq("cluster", "up", "--dir", str(root), *args, timeout_s=30)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    return out.stderr


def test_a_directory_from_another_version_or_half_written_is_refused_at_once(
        tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "cluster.json").write_text(json.dumps({"gateway": {}, "nodes": []}))
    assert "written by another version of sqsq" in _up_error(other)

    half = tmp_path / "half"
    (half / "etcd").mkdir(parents=True)
    assert "half-written" in _up_error(half)
    (half / "cluster.json").write_text('{"format": 1, "nodes": [{"id": "n1"')
    assert "half-written or damaged" in _up_error(half)

    held = tmp_path / "held"
    held.mkdir()
    (held / "cluster.json").write_text(json.dumps({
        "format": 1, "shards": 1, "partitions": 1,
        "nodes": [{"id": f"n{i}", "grpc_port": 1, "raft_port": 2, "metrics_port": 3}
                  for i in (1, 2, 3)],
        "etcd": {"client_port": 4, "peer_port": 5},
        "gateway": {"grpc_port": 6, "http_port": 7, "metrics_port": 8}}))
    assert "holds a cluster with shards 1, not 4" in _up_error(held, "--shards", "4")


def test_up_on_a_directory_says_what_it_holds_when_flags_disagree(up: ClusterUp) -> None:
    err = _up_error(up.root, "--shards", "4")
    # the running one is found first; a stopped one would say its shards do not match
    assert "already running" in err
