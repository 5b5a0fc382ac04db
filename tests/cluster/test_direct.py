"""Direct routing against a real cluster (etcd, three nodes, two shards, a gateway), used the
way an SDK user uses it: the client is given the gateway's address only, and sends its
message calls to the shard leaders itself. It keeps working through a leader killed with
-9, a queue created after it started, nodes it cannot reach (through the gateway, then
direct again once they can be reached), a partitioned FIFO queue, and a rolling restart.

The cluster is shared by the module's tests; a test that kills something starts it again
before it ends, and every test uses queues of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator

import boto3
import pytest
from botocore.config import Config

import clusterproc
from clusterproc import drain
from serverproc import free_port
from sqsq.cli.cluster import GatewayProcess, LocalCluster
from sqsq.client import AsyncClient, Client
from sqsq.errors import QueueError


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("direct"), nodes=3, shards=2).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def wide_gateway(cluster: LocalCluster) -> Iterator[GatewayProcess]:
    """A second gateway on the same cluster, giving new queues two partitions."""
    yield from clusterproc.wide_gateway(cluster, 2)


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def until(check: Callable[[], bool], timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.1)


def gateway_count(cluster: LocalCluster, action: str) -> float:
    """How many ``action`` calls the gateway answered (its /metrics)."""
    text = urllib.request.urlopen(cluster.gateway.metrics_url + "/metrics", timeout=10).read()
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith("sqsq_requests_total{") and f'action="{action}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_message_calls_go_to_the_leaders_and_a_queue_made_later_is_found(
        cluster: LocalCluster) -> None:
    with Client(cluster.gateway.endpoint, timeout=30) as sdk:
        sdk.list_queues()  # started before the queue exists
        queue = name("later")
        with Client(cluster.gateway.endpoint, direct=False) as other:
            other.create_queue(queue)
        sends_before = gateway_count(cluster, "SendMessage")
        routes_before = gateway_count(cluster, "DescribeQueueRoute")
        for i in range(20):
            sdk.send_message(queue, f"m{i}")
        assert sorted(drain(sdk, queue)) == sorted(f"m{i}" for i in range(20))
        stats = sdk.routing_stats
        # 20 sends, then at least two receives and two batch deletes
        assert stats["direct"] >= 24 and stats["fallbacks"] == 0, stats
        assert stats["refreshes"] >= 1
        # The gateway answered none of the sends (the shard leader did), only where to go.
        assert gateway_count(cluster, "SendMessage") == sends_before
        assert gateway_count(cluster, "DescribeQueueRoute") > routes_before
        with pytest.raises(QueueError) as e:  # an unknown queue: the gateway's answer
            sdk.send_message(name("nobody"), "x")
        assert e.value.code == "QueueDoesNotExist"


def test_direct_routing_turned_off_sends_through_the_gateway(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = name("off")
    monkeypatch.setenv("SQSQ_DIRECT", "0")
    with Client(cluster.gateway.endpoint, timeout=30) as sdk:
        sdk.create_queue(queue)
        sends_before = gateway_count(cluster, "SendMessage")
        sdk.send_message(queue, "via the gateway")
        assert gateway_count(cluster, "SendMessage") == sends_before + 1
        assert drain(sdk, queue) == ["via the gateway"]
        assert sdk.routing_stats == {"direct": 0, "fallbacks": 0, "refreshes": 0}


def test_a_leader_killed_under_direct_load_loses_no_acknowledged_send(
        cluster: LocalCluster) -> None:
    queue = name("kill")
    acknowledged: list[str] = []
    errors: list[Exception] = []
    stop = threading.Event()
    with Client(cluster.gateway.endpoint, timeout=30) as sdk:
        sdk.create_queue(queue)

        def send(n: int) -> None:
            i = 0
            while not stop.is_set():
                try:
                    sdk.send_message(queue, f"{n}-{i}")
                    acknowledged.append(f"{n}-{i}")
                except QueueError as exc:  # an outcome the client was told is unknown
                    errors.append(exc)
                i += 1

        senders = [threading.Thread(target=send, args=(n,)) for n in range(2)]
        for t in senders:
            t.start()
        try:
            until(lambda: len(acknowledged) >= 50, what="sends under way")
            shard = next(q["partitions"][0] for q in cluster.status()["queues"]
                         if q["name"] == queue)
            leader = next(s["leader"] for s in cluster.status()["shards"] if s["id"] == shard)
            victim = next(n for n in cluster.nodes if n.node_id == leader)
            count = len(acknowledged)
            cluster.kill9(victim.proc)
            until(lambda: len(acknowledged) >= count + 100, 60, "sends after the kill")
        finally:
            stop.set()
            for t in senders:
                t.join()
        assert sdk.routing_stats["direct"] > 0
        received = drain(sdk, queue)
    assert set(acknowledged) <= set(received), "an acknowledged send was lost"
    assert all(type(e).__name__ == "ServiceUnavailable" for e in errors), errors
    cluster.start_node(victim)
    cluster.wait_ready()


class Forwarder:
    """A TCP port that forwards to another once opened: a node this client can reach."""

    def __init__(self, port: int, to: int) -> None:
        self.port, self.to = port, to
        self._server: socket.socket | None = None
        self._socks: list[socket.socket] = []

    def open(self) -> None:
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.to))
            self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for s in self._socks:
            s.close()


def test_nodes_out_of_reach_are_reached_through_the_gateway_then_directly(
        cluster: LocalCluster) -> None:
    """The client reaches the nodes at other addresses than they advertise (NAT), where
    nothing answers at first: every call goes through the gateway; once the addresses
    answer, calls go to the leaders again."""
    queue = name("nat")
    forwarders = [Forwarder(free_port(), n.grpc_port) for n in cluster.nodes]
    at = {n.endpoint: f"127.0.0.1:{f.port}" for n, f in zip(cluster.nodes, forwarders,
                                                              strict=True)}
    try:
        with Client(cluster.gateway.endpoint, timeout=30, node_addresses=at) as sdk:
            sdk.create_queue(queue)
            for i in range(10):
                sdk.send_message(queue, f"away {i}")
            stats = sdk.routing_stats
            assert stats["direct"] == 0 and stats["fallbacks"] >= 10, stats
            for f in forwarders:
                f.open()
            i = 0

            def direct_again() -> bool:
                nonlocal i
                sdk.send_message(queue, f"back {i}")
                i += 1
                return sdk.routing_stats["direct"] > 0

            until(direct_again, 30, "direct calls once the nodes can be reached")
            assert sorted(drain(sdk, queue)) == sorted(
                [f"away {n}" for n in range(10)] + [f"back {n}" for n in range(i)])
    finally:
        for f in forwarders:
            f.close()


def test_a_partitioned_fifo_queue_keeps_each_groups_order(
        cluster: LocalCluster, wide_gateway: GatewayProcess) -> None:
    fifo, std = name("wide") + ".fifo", name("wide")
    groups = [f"g{g}" for g in range(6)]

    async def run() -> tuple[dict[str, list[int]], list[str], dict[str, int]]:
        async with AsyncClient(wide_gateway.endpoint, timeout=30) as sdk:
            await sdk.create_queue(fifo, attributes={"FifoQueue": "true",
                                                     "ContentBasedDeduplication": "true"})
            await sdk.create_queue(std)
            for i in range(10):
                await sdk.send_message_batch(fifo, [
                    {"Id": g, "MessageBody": f"{g}:{i}", "MessageGroupId": g}
                    for g in groups])
            await sdk.send_message(fifo, "g0:0", message_group_id="g0")  # a duplicate
            await asyncio.gather(*(sdk.send_message(std, f"s{i}") for i in range(20)))
            received: dict[str, list[int]] = {g: [] for g in groups}
            empty = 0
            while empty < 3:
                got = await sdk.receive_message(fifo, 10, wait_time_seconds=1)
                empty = 0 if got else empty + 1
                for m in got:
                    g, i = m.body.split(":")
                    received[g].append(int(i))
                    await sdk.delete_message(fifo, m.receipt_handle)
            bodies: list[str] = []
            empty = 0
            while empty < 3:
                got = await sdk.receive_message(std, 10, wait_time_seconds=1)
                empty = 0 if got else empty + 1
                for m in got:
                    bodies.append(m.body)
                    await sdk.delete_message(std, m.receipt_handle)
            return received, bodies, sdk.routing_stats

    received, bodies, stats = asyncio.run(run())
    placed = {q["name"]: q["partitions"] for q in cluster.status()["queues"]}
    assert sorted(placed[fifo]) == sorted(placed[std]) == [0, 1]
    assert received == {g: list(range(10)) for g in groups}  # per group, in order
    assert sorted(bodies) == sorted(f"s{i}" for i in range(20))
    assert stats["direct"] > 0 and stats["fallbacks"] == 0, stats


def test_boto3_through_the_gateway_is_unchanged(cluster: LocalCluster) -> None:
    sqs = boto3.client("sqs", endpoint_url=cluster.gateway.http_url, region_name="us-east-1",
                       aws_access_key_id="x", aws_secret_access_key="y",
                       config=Config(retries={"max_attempts": 1}))
    url = sqs.create_queue(QueueName=name("b3"))["QueueUrl"]
    with Client(cluster.gateway.endpoint, timeout=30) as sdk:
        sdk.send_message(url, "from the sdk, directly")
        assert sdk.routing_stats["direct"] == 1
    before = passed_through(cluster.gateway)
    sent = sqs.send_message(QueueUrl=url, MessageBody="from boto3", MessageAttributes={
        "n": {"DataType": "Number", "StringValue": "7"}})
    assert sent["MD5OfMessageBody"] == hashlib.md5(b"from boto3").hexdigest()  # noqa: S324
    got = []
    while len(got) < 2:
        got += sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2, MaxNumberOfMessages=10,
                                   MessageAttributeNames=["All"],
                                   AttributeNames=["All"]).get("Messages", [])
    by_body = {m["Body"]: m for m in got}
    assert set(by_body) == {"from the sdk, directly", "from boto3"}
    assert by_body["from boto3"]["MessageAttributes"] == {
        "n": {"DataType": "Number", "StringValue": "7"}}
    assert by_body["from boto3"]["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert by_body["from boto3"]["Attributes"]["ApproximateReceiveCount"] == "1"
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"],
                                  VisibilityTimeout=30)
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)])
    assert sorted(e["Id"] for e in deleted["Successful"]) == ["0", "1"]
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.delete_message(QueueUrl=url, ReceiptHandle="garbled")
    assert not sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages")
    # Each of those was a call for the queue's one shard: passed through undecoded.
    assert passed_through(cluster.gateway) >= before + 6


def test_a_rolling_restart_under_direct_load_loses_nothing_and_shows_no_error(
        cluster: LocalCluster) -> None:
    queue = name("rolling")
    acknowledged: list[str] = []
    received: set[str] = set()
    errors: list[tuple[str, Exception]] = []
    stop = threading.Event()
    with Client(cluster.gateway.endpoint, timeout=30) as sdk:
        sdk.create_queue(queue, {"VisibilityTimeout": "30"})

        def send(n: int) -> None:
            i = 0
            while not stop.is_set():
                try:
                    sdk.send_message(queue, f"{n}-{i}")
                    acknowledged.append(f"{n}-{i}")
                except Exception as exc:  # noqa: BLE001 - any error the client saw counts
                    errors.append(("send", exc))
                i += 1

        def receive() -> None:
            while not stop.is_set():
                try:
                    for m in sdk.receive_message(queue, 10, wait_time_seconds=1):
                        sdk.delete_message(queue, m.receipt_handle)
                        received.add(m.body)
                except Exception as exc:  # noqa: BLE001
                    errors.append(("receive or delete", exc))

        threads = [threading.Thread(target=send, args=(n,)) for n in range(2)]
        threads.append(threading.Thread(target=receive))
        for t in threads:
            t.start()
        try:
            until(lambda: len(acknowledged) >= 50, 30, "the load running")
            before = len(acknowledged)
            steps = cluster.rolling_restart()
            until(lambda: len(acknowledged) >= before + 100, 30, "the load going on after")
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert sorted(s["node"] for s in steps) == ["n1", "n2", "n3"]

        def drained() -> bool:
            for m in sdk.receive_message(queue, 10, wait_time_seconds=1):
                sdk.delete_message(queue, m.receipt_handle)
                received.add(m.body)
            return set(acknowledged) <= received

        until(drained, 60, "every acknowledged message received")
        assert sdk.routing_stats["direct"] > 0
    assert errors == [], [(op, repr(e)) for op, e in errors]


def passed_through(gateway: GatewayProcess) -> float:
    text = urllib.request.urlopen(gateway.metrics_url + "/metrics", timeout=10).read()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.decode().splitlines()
               if line.startswith("sqsq_gateway_passed_through_total{"))


def test_grpc_calls_through_the_gateway_are_passed_to_their_shard_as_they_came(
        cluster: LocalCluster) -> None:
    """A client that stays on the gateway (direct routing off, as another language's gRPC
    client): its message calls for one shard are passed through undecoded, and answer
    exactly as before."""
    queue = name("through")
    before = passed_through(cluster.gateway)
    with Client(cluster.gateway.endpoint, timeout=30, direct=False) as gw:
        gw.create_queue(queue)
        sent = gw.send_message(queue, "hello", message_attributes={
            "colour": {"DataType": "String", "StringValue": "blue"}})
        assert sent.md5_of_message_body == "5d41402abc4b2a76b9719d911017c592"
        result = gw.send_message_batch(queue, [
            {"Id": "ok", "MessageBody": "two"}, {"Id": "bad", "MessageBody": "x",
                                                 "DelaySeconds": 901}])
        assert [s.id for s in result.successful] == ["ok"]
        assert [(f.id, f.code) for f in result.failed] == [("bad", "InvalidParameterValue")]
        got = gw.receive_message(queue, 10, wait_time_seconds=1, attribute_names=["All"],
                                 message_attribute_names=["All"])
        by_body = {m.body: m for m in got}
        assert set(by_body) == {"hello", "two"}
        hello = by_body["hello"]
        assert hello.message_id == sent.message_id
        assert hello.message_attributes == {"colour": {"DataType": "String",
                                                       "StringValue": "blue"}}
        assert hello.md5_of_message_attributes == sent.md5_of_message_attributes
        assert hello.attributes["ApproximateReceiveCount"] == "1"
        gw.change_message_visibility(queue, hello.receipt_handle, 60)
        with pytest.raises(QueueError) as e:
            gw.delete_message(queue, "not-a-handle")
        assert e.value.code == "ReceiptHandleIsInvalid"
        batch = gw.delete_message_batch(queue, [
            {"Id": m.body, "ReceiptHandle": m.receipt_handle} for m in got])
        assert sorted(s.id for s in batch.successful) == ["hello", "two"]
        assert gw.receive_message(queue, 10, wait_time_seconds=0) == []
        assert gw.routing_stats["direct"] == 0
    assert passed_through(cluster.gateway) >= before + 7


def test_a_partitioned_fifo_queue_through_the_gateway_keeps_each_groups_order(
        wide_gateway: GatewayProcess) -> None:
    fifo = name("through") + ".fifo"
    groups = [f"g{g}" for g in range(4)]
    with Client(wide_gateway.endpoint, timeout=30, direct=False) as gw:
        gw.create_queue(fifo, attributes={"FifoQueue": "true",
                                          "ContentBasedDeduplication": "true"})
        for i in range(5):
            for g in groups:  # one group a call: each passed through to its partition
                gw.send_message(fifo, f"{g}:{i}", message_group_id=g)
        received: dict[str, list[int]] = {g: [] for g in groups}
        for body in drain(gw, fifo):
            g, i = body.split(":")
            received[g].append(int(i))
    assert received == {g: list(range(5)) for g in groups}


def test_a_moved_leader_is_followed_directly_and_by_a_stale_gateway(
        cluster: LocalCluster) -> None:
    """etcd is stopped, so neither the gateway's map nor the routes it gives out learn that
    the leader moved. The leader is frozen (SIGSTOP) past an election: the direct client
    moves on to the new leader by itself; resumed, the old leader answers NotLeader naming
    the new one, and the gateway (passing a client's calls through) follows it."""
    import os
    import signal

    queue = name("moved")
    with Client(cluster.gateway.endpoint, timeout=30, direct=False) as gw, \
            Client(cluster.gateway.endpoint, timeout=30) as sdk:
        gw.create_queue(queue)
        gw.send_message(queue, "before the move")  # the gateway now calls the leader first
        sdk.send_message(queue, "directly, before")
        shard = next(q["partitions"][0] for q in cluster.status()["queues"]
                     if q["name"] == queue)
        leader = next(s["leader"] for s in cluster.status()["shards"] if s["id"] == shard)
        victim = next(n for n in cluster.nodes if n.node_id == leader)
        cluster.etcd.stop()
        try:
            os.kill(victim.proc.pid, signal.SIGSTOP)
            try:
                sdk.send_message(queue, "directly, to the new leader")
            finally:
                os.kill(victim.proc.pid, signal.SIGCONT)
            gw.send_message(queue, "through the stale gateway")
            assert sorted(drain(gw, queue)) == sorted([
                "before the move", "directly, before", "directly, to the new leader",
                "through the stale gateway"])
        finally:
            cluster.etcd.start()
        assert sdk.routing_stats["fallbacks"] == 0
    cluster.wait_ready()
