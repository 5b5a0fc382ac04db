"""A real cluster (etcd, four nodes, four shards of three replicas, gateways) started the
way ``sqsq cluster up`` starts one, used the way its users use it: the SDK and boto3 through a
gateway, nodes killed with -9, the gateway restarted, etcd stopped for a while.

The cluster is shared by the module's tests; a test that kills something starts it again
before it ends, and every test uses queues of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import boto3
import grpc
import pytest
from botocore.config import Config

import clusterproc
from clusterproc import drain
from serverproc import REPO
from sqsq.api import SHARD_METADATA_KEY
from sqsq.cli.cluster import GatewayProcess, LocalCluster
from sqsq.client import Client
from sqsq.errors import QueueError
from sqsq.v1 import queues_pb2, queues_pb2_grpc

SHARDS = 4
REPLACE_AFTER_S = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("cluster"), nodes=4, shards=SHARDS,
                     node_args=("--replace-after", str(REPLACE_AFTER_S))).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def wide_gateway(cluster: LocalCluster) -> Iterator[GatewayProcess]:
    """A second gateway on the same cluster, giving new queues four partitions."""
    yield from clusterproc.wide_gateway(cluster, 4)


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.gateway.endpoint, timeout=30) as c:
        yield c


def name(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_cluster_json_and_status_describe_what_runs(cluster: LocalCluster) -> None:
    info = json.loads((cluster.root / "cluster.json").read_text())
    assert info["gateway"]["grpc_port"] == cluster.gateway.grpc_port
    assert info["etcd"]["client_port"] == cluster.etcd.client_port
    assert [n["pid"] for n in info["nodes"]] == [n.proc.pid for n in cluster.nodes]
    out = subprocess.run(
        [sys.executable, "-m", "sqsq.cli.main", "cluster", "status", "--dir",
         str(cluster.root), "--json"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert {n["id"] for n in status["nodes"] if n["alive"]} == {"n1", "n2", "n3", "n4"}
    assert sorted(s["id"] for s in status["shards"]) == list(range(SHARDS))
    for shard in status["shards"]:
        assert len(set(shard["replicas"])) == 3
        assert shard["leader"] in shard["replicas"]
    load = [sum(n in s["replicas"] for s in status["shards"]) for n in ("n1", "n2", "n3", "n4")]
    assert load == [3, 3, 3, 3]  # 12 replicas over 4 nodes


def test_queues_land_on_different_shards_and_answer_through_the_gateway(
        cluster: LocalCluster, client: Client) -> None:
    names = [name("spread") for _ in range(8)]
    for n in names:
        client.create_queue(n)
        client.send_message(n, f"to {n}")
    placed = {q["name"]: q["partitions"] for q in cluster.status()["queues"]}
    assert len({placed[n][0] for n in names}) == SHARDS  # 8 queues over 4 shards
    listed = client.list_queues(queue_name_prefix="spread-")
    assert sorted(u.rsplit("/", 1)[1] for u in listed) == sorted(names)
    for n in names:  # one message each, received whole: one empty long poll says it is all
        assert drain(client, n, idle_receives=1) == [f"to {n}"]


def test_boto3_sees_the_same_api_through_the_gateway(cluster: LocalCluster) -> None:
    sqs = boto3.client("sqs", endpoint_url=cluster.gateway.http_url, region_name="us-east-1",
                       aws_access_key_id="x", aws_secret_access_key="y",
                       config=Config(retries={"max_attempts": 1}))
    dlq = sqs.create_queue(QueueName=name("dead"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    url = sqs.create_queue(QueueName=name("b3"), Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})})["QueueUrl"]
    assert url.startswith(cluster.gateway.http_url)
    sqs.send_message(QueueUrl=url, MessageBody="once")
    first = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=1)
    assert [m["Body"] for m in first["Messages"]] == ["once"]
    # Received once already: the next receive moves it to the dead-letter queue.
    assert not sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages")
    dead = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=2)["Messages"]
    assert [m["Body"] for m in dead] == ["once"]
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [url]
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=name("nobody"))


def test_a_dead_letter_queue_on_another_shard_than_its_source(cluster: LocalCluster) -> None:
    """A redrive policy set on a queue whose dead-letter queue lives on another shard: the
    redrive, ListDeadLetterSourceQueues and a move task back all work across shards."""
    sqs = boto3.client("sqs", endpoint_url=cluster.gateway.http_url, region_name="us-east-1",
                       aws_access_key_id="x", aws_secret_access_key="y",
                       config=Config(retries={"max_attempts": 1}))
    src = sqs.create_queue(QueueName=name("src"))["QueueUrl"]

    def shard_of(url: str) -> list[int]:
        return next(q["partitions"] for q in cluster.status()["queues"]
                    if q["name"] == url.rsplit("/", 1)[1])

    dlq = next(u for u in (sqs.create_queue(QueueName=name("far"))["QueueUrl"]
                           for _ in range(SHARDS)) if shard_of(u) != shard_of(src))
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    sqs.set_queue_attributes(QueueUrl=src, Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})})
    sqs.send_message(QueueUrl=src, MessageBody="far away")
    sqs.receive_message(QueueUrl=src, VisibilityTimeout=0, WaitTimeSeconds=1)
    assert not sqs.receive_message(QueueUrl=src, WaitTimeSeconds=1).get("Messages")
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [src]
    assert sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["All"])["Attributes"][
        "ApproximateNumberOfMessages"] == "1"
    sqs.start_message_move_task(SourceArn=dlq_arn)
    _wait_for(lambda: sqs.get_queue_attributes(QueueUrl=src, AttributeNames=["All"])[
        "Attributes"]["ApproximateNumberOfMessages"] == "1")
    back = sqs.receive_message(QueueUrl=src, WaitTimeSeconds=1)["Messages"]
    assert [m["Body"] for m in back] == ["far away"]


def test_a_four_partition_queue_delivers_like_one_partition(
        cluster: LocalCluster, wide_gateway: GatewayProcess) -> None:
    with Client(wide_gateway.endpoint, timeout=30) as wide:
        std, fifo = name("wide"), name("wide") + ".fifo"
        wide.create_queue(std)
        wide.create_queue(fifo, attributes={"FifoQueue": "true",
                                            "ContentBasedDeduplication": "true"})
        placed = {q["name"]: q["partitions"] for q in cluster.status()["queues"]}
        assert sorted(placed[std]) == sorted(placed[fifo]) == list(range(SHARDS))

        sent = [f"m{i}" for i in range(40)]
        for i in range(0, 40, 10):
            wide.send_message_batch(std, [{"Id": str(j), "MessageBody": b}
                                          for j, b in enumerate(sent[i:i + 10])])
        assert wide.get_queue_attributes(std)["ApproximateNumberOfMessages"] == "40"
        assert sorted(drain(wide, std)) == sorted(sent)

        groups = [f"g{g}" for g in range(6)]
        for i in range(10):
            wide.send_message_batch(fifo, [
                {"Id": g, "MessageBody": f"{g}:{i}", "MessageGroupId": g} for g in groups])
        wide.send_message(fifo, "g0:0", message_group_id="g0")  # a duplicate: dropped
        received: dict[str, list[int]] = {g: [] for g in groups}
        for body in drain(wide, fifo):
            g, i = body.split(":")
            received[g].append(int(i))
        assert received == {g: list(range(10)) for g in groups}  # per group, in order


def test_kill9_of_a_leader_under_load_loses_nothing_and_three_replicas_return(
        cluster: LocalCluster, client: Client) -> None:
    queue = name("load")
    client.create_queue(queue)
    shard = next(q["partitions"][0] for q in cluster.status()["queues"] if q["name"] == queue)
    acknowledged: list[str] = []
    stop = threading.Event()
    errors: list[Exception] = []

    def send() -> None:
        with Client(cluster.gateway.endpoint, timeout=30) as sender:
            i = 0
            while not stop.is_set():
                body = f"{threading.get_ident()}-{i}"
                try:
                    sender.send_message(queue, body)
                    acknowledged.append(body)
                except QueueError as exc:  # an outcome the client was told is unknown
                    errors.append(exc)
                i += 1

    senders = [threading.Thread(target=send) for _ in range(2)]
    for t in senders:
        t.start()
    try:
        _wait_for(lambda: len(acknowledged) >= 50)
        before = cluster.status()
        leader_id = next(s["leader"] for s in before["shards"] if s["id"] == shard)
        victim = next(n for n in cluster.nodes if n.node_id == leader_id)
        held = {s["id"]: s["epoch"] for s in before["shards"] if leader_id in s["replicas"]}
        count = len(acknowledged)
        cluster.kill9(victim.proc)
        _wait_for(lambda: len(acknowledged) >= count + 100, timeout_s=60)
        # The controller gives each of the dead node's replicas to the spare node, and each
        # shard's leader carries the change out in Raft: three live replicas again.
        _wait_for(lambda: _restored(cluster, victim.node_id, held), timeout_s=90)
    finally:
        stop.set()
        for t in senders:
            t.join()
    received = drain(client, queue)
    assert set(acknowledged) <= set(received), "an acknowledged send was lost"
    assert all(type(e).__name__ == "ServiceUnavailable" for e in errors), errors
    cluster.start_node(victim)  # back, but holding nothing it was replaced in
    status = cluster.wait_ready()
    assert all(victim.node_id not in s["replicas"] for s in status["shards"] if s["id"] in held)


def _restored(cluster: LocalCluster, dead: str, held: dict[int, int]) -> bool:
    """Every shard the dead node held has three live replicas without it, at a higher epoch,
    and a leader that has applied that replica set (its hint carries the epoch)."""
    status = cluster.status()
    alive = {n["id"] for n in status["nodes"] if n["alive"]}
    return all(
        dead not in s["replicas"] and set(s["replicas"]) <= alive and s["epoch"] > held[s["id"]]
        and s["leader"] is not None and s["applied_epoch"] == s["epoch"]
        for s in status["shards"] if s["id"] in held)


def test_a_restarted_gateway_loses_nothing(cluster: LocalCluster) -> None:
    queue = name("gw")
    with Client(cluster.gateway.endpoint, timeout=30) as c:
        c.create_queue(queue)
        for i in range(20):
            c.send_message(queue, f"kept {i}")
    cluster.kill9(cluster.gateway.proc)
    cluster.start_gateway()
    with Client(cluster.gateway.endpoint, timeout=30) as c:
        assert sorted(drain(c, queue)) == sorted(f"kept {i}" for i in range(20))


def test_the_data_path_serves_while_etcd_is_down(cluster: LocalCluster,
                                                 client: Client) -> None:
    queue = name("noetcd")
    client.create_queue(queue)
    cluster.etcd.stop()
    try:
        down_since = time.monotonic()
        sent = 0
        while time.monotonic() - down_since < 10:  # etcd stays down 10 s, by the clock
            client.send_message(queue, f"while down {sent}")
            sent += 1
        got = drain(client, queue)
        assert sorted(got) == sorted(f"while down {i}" for i in range(sent))
        with pytest.raises(QueueError):  # a new queue needs etcd: refused, not half-made
            client.create_queue(name("later"))
    finally:
        cluster.etcd.start()
    # etcd is back: the nodes register again, leaders republish, the controller resumes.
    cluster.wait_ready()
    _wait_for(lambda: all(n["alive"] for n in cluster.status()["nodes"]))
    late = name("after")
    client.create_queue(late)
    client.send_message(late, "after etcd came back")
    assert drain(client, late) == ["after etcd came back"]


def test_a_stale_gateway_cache_follows_a_moved_leader(cluster: LocalCluster,
                                                      client: Client) -> None:
    """etcd is stopped, so the gateway cannot learn that the leader moved; the old leader
    (paused past an election, then resumed as a follower) answers NotLeader naming the new
    one, and the gateway follows it by itself."""
    queue = name("moved")
    client.create_queue(queue)
    client.send_message(queue, "before the move")  # the gateway now calls the leader first
    shard = next(q["partitions"][0] for q in cluster.status()["queues"] if q["name"] == queue)
    status = cluster.status()
    old = next(s for s in status["shards"] if s["id"] == shard)
    victim = next(n for n in cluster.nodes if n.node_id == old["leader"])
    others = [n.endpoint for n in cluster.nodes if n.node_id in old["replicas"]
              and n is not victim]
    cluster.etcd.stop()
    try:
        os.kill(victim.proc.pid, signal.SIGSTOP)
        try:
            _send_to_shard(others, shard, queue, "to the new leader")  # a new leader serves
        finally:
            os.kill(victim.proc.pid, signal.SIGCONT)
        client.send_message(queue, "through the stale gateway")
        assert sorted(drain(client, queue)) == [
            "before the move", "through the stale gateway", "to the new leader"]
    finally:
        cluster.etcd.start()
    cluster.wait_ready()


def _send_to_shard(endpoints: list[str], shard: int, queue: str, body: str,
                   timeout_s: float = 30.0) -> None:
    """One send straight to a shard's replicas, as a gateway makes it, tried until one of
    them leads (one request id: a retry never makes a second message)."""
    request = queues_pb2.SendMessageRequest(queue_url=queue, message_body=body,
                                            request_id=uuid.uuid4().hex)
    deadline = time.monotonic() + timeout_s
    while True:
        for endpoint in endpoints:
            with grpc.insecure_channel(endpoint) as channel:
                try:
                    queues_pb2_grpc.QueuesStub(channel).SendMessage(
                        request, metadata=((SHARD_METADATA_KEY, str(shard)),), timeout=5)
                    return
                except grpc.RpcError:
                    continue  # not the leader (yet), or no leader elected yet
        if time.monotonic() > deadline:
            raise AssertionError(f"no replica of shard {shard} took the send")
        time.sleep(0.1)


def _wait_for(predicate, timeout_s: float = 30.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)

