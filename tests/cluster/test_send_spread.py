"""A standard queue's sends on a cluster of four shards, as its users see them (each message's
receipt handle names the shard it lived on): the SDK's and the gateway's sends all go to the
queue's home partition while the leader there keeps up, so that they share one shard's Raft
entries; while that leader's node says it is busy (its record in etcd), they spread over the
next partitions too, and come home once it is calm again.

The cluster is shared by the module's tests, each with queues of its own.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import boto3
import grpc
import pytest
from botocore.config import Config

from sqsq.cli.cluster import LocalCluster
from sqsq.client import Client, _direct
from sqsq.control import keys
from sqsq.control.etcd import Etcd
from sqsq.v1 import queues_pb2 as pb
from sqsq.v1 import queues_pb2_grpc
from sqsq.wire import SendSpread, shard_of_receipt_handle

SHARDS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("spread"), nodes=3, shards=SHARDS,
                     partitions=SHARDS).start()
    try:
        # the leaders spread over the nodes first (they move in the cluster's first seconds,
        # and a queue's sends follow whether its partitions' leaders are busy)
        deadline = time.monotonic() + 60
        while sorted(len(n["leads"]) for n in c.status()["nodes"]) != [1, 1, 2]:
            assert time.monotonic() < deadline, c.status()["nodes"]
            time.sleep(0.2)
        yield c
    finally:
        c.stop()


def route(cluster: LocalCluster, queue: str) -> pb.QueueRoute:
    """What the gateway tells the SDK about ``queue`` (DescribeQueueRoute)."""
    with grpc.insecure_channel(cluster.gateway.endpoint) as channel:
        return queues_pb2_grpc.QueuesStub(channel).DescribeQueueRoute(
            pb.QueueRequest(queue_url=queue), timeout=10)


def set_busy(cluster: LocalCluster, node_id: str, busy: bool) -> None:
    """Write what a node whose event loop is near full (or calm again) writes: its record,
    under its own lease."""
    async def put() -> None:
        async with Etcd(cluster.etcd_endpoint) as etcd:
            kv = await etcd.get(keys.node_key(node_id))
            assert kv is not None, node_id
            record = replace(keys.decode_node(kv.value), busy=busy)
            await etcd.put(keys.node_key(node_id), keys.encode(record), lease=kv.lease)

    asyncio.run(put())


def wait_width(cluster: LocalCluster, queue: str, wide: bool) -> pb.QueueRoute:
    """The queue's route once its sends take one partition (``wide`` False) or more."""
    deadline = time.monotonic() + 20
    while True:
        got = route(cluster, queue)
        if (got.send_width > 1) == wide:
            return got
        assert time.monotonic() < deadline, f"send_width stayed {got.send_width}"
        time.sleep(0.1)


def shards_sent_to(route_now: pb.QueueRoute) -> set[int]:
    """The shards a route's standard sends take: ``send_width`` partitions from home on."""
    return {route_now.partitions[(route_now.send_home + k) % SHARDS].shard
            for k in range(route_now.send_width)}


def status_of(cluster: LocalCluster, queue: str) -> dict:
    """The queue as ``sqsq cluster status --json`` shows it."""
    return next(q for q in cluster.status()["queues"] if q["name"] == queue)


def leader_of(cluster: LocalCluster, shard: int) -> str:
    """The node id the shard's leader hint names."""
    async def get() -> str:
        async with Etcd(cluster.etcd_endpoint) as etcd:
            kv = await etcd.get(keys.leader_key(shard))
            assert kv is not None, shard
            return keys.decode_leader(kv.value).node_id

    return asyncio.run(get())


def shards_received(client: Client, queue: str, count: int) -> Counter:
    """How many of the queue's ``count`` messages each shard held (all received, deleted)."""
    shards: Counter = Counter()
    deadline = time.monotonic() + 60
    while sum(shards.values()) < count:
        assert time.monotonic() < deadline, f"{sum(shards.values())} of {count} received"
        got = client.receive_message(queue, max_number_of_messages=10, wait_time_seconds=1)
        for message in got:
            shards[shard_of_receipt_handle(message.receipt_handle)] += 1
            client.delete_message(queue, message.receipt_handle)
    return shards


def boto3_sqs(cluster: LocalCluster):  # noqa: ANN201 - boto3's client has no public type
    return boto3.client("sqs", endpoint_url=cluster.gateway.http_url, region_name="us-east-1",
                        aws_access_key_id="x", aws_secret_access_key="x",
                        config=Config(retries={"max_attempts": 0}))


def send_both_ways(cluster: LocalCluster, client: Client, queue: str, count: int) -> None:
    """``count`` sends from the SDK (straight to the leaders) and ``count`` through the
    gateway's HTTP API (boto3), each a turn of its own."""
    client._routes.sends = SendSpread(calls=1)  # a burst per call: each may take a partition
    for i in range(count):
        client.send_message(queue, f"sdk-{i}")
    url = boto3_sqs(cluster).get_queue_url(QueueName=queue)["QueueUrl"]
    sqs = boto3_sqs(cluster)
    for i in range(count):
        sqs.send_message(QueueUrl=url, MessageBody=f"http-{i}")


def new_queue(cluster: LocalCluster, prefix: str) -> tuple[str, pb.QueueRoute, int]:
    """A new standard queue, its route as the gateway first gives it, and its home shard."""
    queue = f"{prefix}-{uuid.uuid4().hex[:8]}"
    with Client(cluster.gateway.endpoint, timeout=30) as client:
        client.create_queue(queue)
    first = route(cluster, queue)
    return queue, first, first.partitions[first.send_home].shard


def test_sends_from_every_client_meet_on_the_queues_home_partition(
        cluster: LocalCluster) -> None:
    queue, first, home_shard = new_queue(cluster, "home")
    assert first.send_width == 1 and len(first.partitions) == SHARDS
    with Client(cluster.gateway.endpoint, timeout=30) as client:
        send_both_ways(cluster, client, queue, 24)
        assert client.routing_stats["direct"] >= 24  # the SDK's went to the leader itself
        assert shards_received(client, queue, 48) == Counter({home_shard: 48})
    assert status_of(cluster, queue)["sends_to"] == [first.send_home]


def test_a_client_already_sending_widens_within_a_second_or_two_of_the_leader_turning_busy(
        cluster: LocalCluster) -> None:
    """The route a client holds names the send width; a standard queue of several partitions
    has it asked for again every ``SEND_WIDTH_TTL_S``, so a client that keeps sending follows
    a leader that turns busy without a new client (after ``ROUTE_TTL_S`` it would still be
    sending everything home)."""
    queue, _, home_shard = new_queue(cluster, "follow")
    leader = leader_of(cluster, home_shard)
    with Client(cluster.gateway.endpoint, timeout=30) as client:
        client._routes.sends = SendSpread(calls=1)  # a burst per call: each may take a partition
        client.send_message(queue, "before")  # the route learnt: the home partition only
        learnt = time.monotonic()
        set_busy(cluster, leader, True)
        try:
            wide = wait_width(cluster, queue, True)
            widened = shards_sent_to(wide)
            sent = 1
            while time.monotonic() < learnt + 3.0:  # a few of the route's seconds
                client.send_message(queue, f"m{sent}")
                sent += 1
                time.sleep(0.05)  # (paced: a few dozen messages over the seconds it takes)
            assert time.monotonic() < learnt + _direct.ROUTE_TTL_S, "too slow to tell apart"
            spread = shards_received(client, queue, sent)
        finally:
            set_busy(cluster, leader, False)
    assert spread[home_shard] >= 1 and len(spread) >= 2 and set(spread) <= widened, spread


def test_a_busy_leader_spreads_the_sends_past_home_until_it_is_calm(
        cluster: LocalCluster) -> None:
    queue, calm, home_shard = new_queue(cluster, "busy")
    leader = leader_of(cluster, home_shard)
    set_busy(cluster, leader, True)
    try:
        wide = wait_width(cluster, queue, True)
        assert wide.send_home == calm.send_home
        widened = shards_sent_to(wide)
        assert home_shard in widened
        assert status_of(cluster, queue)["sends_to"] == [
            (wide.send_home + k) % SHARDS for k in range(wide.send_width)]
        text = subprocess.run(
            [sys.executable, "-m", "sqsq.cli.main", "cluster", "status", "--etcd",
             cluster.etcd_endpoint], capture_output=True, text=True, timeout=60).stdout
        assert f"node {leader}: alive" in text and ", busy" in text.split(f"node {leader}:")[1] \
            .splitlines()[0]
        assert f"queue {queue}: partitions on shards" in text and "sends to partitions" in text
        with Client(cluster.gateway.endpoint, timeout=30) as client:  # (a route of its own)
            send_both_ways(cluster, client, queue, 24)
            spread = shards_received(client, queue, 48)
        assert set(spread) <= widened and len(spread) >= 2, (spread, widened)
    finally:
        set_busy(cluster, leader, False)
    assert wait_width(cluster, queue, False).send_home == calm.send_home
    with Client(cluster.gateway.endpoint, timeout=30) as client:
        send_both_ways(cluster, client, queue, 12)
        assert shards_received(client, queue, 24) == Counter({home_shard: 24})
