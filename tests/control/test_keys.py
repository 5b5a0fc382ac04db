"""The key layout and its records: what a reader of etcd finds, and what it refuses."""

from __future__ import annotations

import pytest

from sqsq.control import keys
from sqsq.control.keys import LeaderHint, NodeRecord, QueueRecord, RecordError, ShardRecord


def test_every_record_round_trips_through_its_key() -> None:
    records = [
        (keys.node_key("n1"), NodeRecord("n1", "127.0.0.1:7401", "127.0.0.1:7500")),
        (keys.shard_key(3), ShardRecord(3, ("n1", "n2", "n3"), 7)),
        (keys.queue_key("orders.fifo"), QueueRecord("orders.fifo", "q-1", (0, 1, 0, 2))),
        (keys.leader_key(3), LeaderHint(3, "n2", 12)),
    ]
    for key, record in records:
        assert key.startswith("/sqsq/")
        assert keys.decode(key, keys.encode(record)) == record


def test_key_layout_is_the_documented_one() -> None:
    assert keys.node_key("n1") == "/sqsq/nodes/n1"
    assert keys.shard_key(0) == "/sqsq/shards/0"
    assert keys.queue_key("jobs") == "/sqsq/queues/jobs"
    assert keys.leader_key(5) == "/sqsq/leaders/5"
    assert keys.parse_key("/sqsq/queues/jobs") == ("queues", "jobs")


def test_a_node_gives_each_shard_its_own_raft_port() -> None:
    node = NodeRecord("n1", "10.0.0.1:7401", "10.0.0.1:7500")
    assert node.raft_for(0) == "10.0.0.1:7500"
    assert node.raft_for(4) == "10.0.0.1:7504"


def test_a_replica_change_raises_the_epoch() -> None:
    shard = ShardRecord(1, ("a", "b", "c"), 4)
    moved = shard.with_replicas(("a", "b", "d"))
    assert moved.epoch == 5 and moved.replicas == ("a", "b", "d")


@pytest.mark.parametrize("key, value", [
    ("/sqsq/shards/1", b"not json"),
    ("/sqsq/shards/1", b"[1, 2]"),
    ("/sqsq/shards/1", b'{"shard_id": 1, "replicas": ["a"], "epoch": "7"}'),
    ("/sqsq/shards/1", b'{"shard_id": 1, "replicas": ["a", "a"], "epoch": 1}'),
    ("/sqsq/shards/1", b'{"shard_id": 1, "replicas": ["a"], "epoch": true}'),
    ("/sqsq/shards/2", b'{"shard_id": 1, "replicas": ["a"], "epoch": 1}'),  # wrong key
    ("/sqsq/queues/q", b'{"name": "q", "queue_id": "x", "partitions": []}'),
    ("/sqsq/queues/q", b'{"name": "q", "queue_id": "x", "partitions": ["0"]}'),
    ("/sqsq/nodes/n1", b'{"node_id": "n1", "grpc": "h:1"}'),
    ("/sqsq/nodes/n1", b'{"node_id": "n1", "grpc": "h:1", "raft": "h:2", "busy": 1}'),
    ("/sqsq/other/x", b"{}"),
])
def test_corrupt_or_misplaced_records_are_refused(key: str, value: bytes) -> None:
    with pytest.raises(RecordError):
        keys.decode(key, value)


def test_unknown_fields_are_ignored_for_newer_writers() -> None:
    value = b'{"shard_id": 1, "replicas": ["a"], "epoch": 2, "added_later": 1}'
    assert keys.decode("/sqsq/shards/1", value) == ShardRecord(1, ("a",), 2)


def test_ids_cannot_escape_their_directory() -> None:
    for key in ("../b", "a/b/c", "eu-west-1/", "/b"):
        with pytest.raises(RecordError):
            keys.queue_key(key)
    with pytest.raises(RecordError):
        keys.shard_key(-1)


def test_a_queue_outside_the_configured_region_is_keyed_by_its_region() -> None:
    assert keys.queue_key("eu-west-1/jobs") == "/sqsq/queues/eu-west-1/jobs"
    record = QueueRecord("eu-west-1/jobs", "q-2", (1,))
    assert keys.decode(keys.queue_key(record.name), keys.encode(record)) == record


def test_a_node_says_busy_only_when_it_is_and_an_older_record_reads_as_not_busy() -> None:
    calm = NodeRecord("n1", "h:1", "h:2")
    assert b"busy" not in keys.encode(calm)  # an idle cluster's records stay as they were
    busy = NodeRecord("n1", "h:1", "h:2", busy=True)
    assert keys.decode(keys.node_key("n1"), keys.encode(busy)) == busy
    assert keys.decode(keys.node_key("n1"),
                       b'{"node_id": "n1", "grpc": "h:1", "raft": "h:2"}') == calm
