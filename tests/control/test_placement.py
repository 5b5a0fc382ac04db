"""Placement: where a new shard's replicas, a new queue's partitions and a replacement go."""

from __future__ import annotations

import pytest

from sqsq.control.keys import QueueRecord, ShardRecord
from sqsq.control.placement import (
    PlacementError,
    assign_partitions,
    choose_replacement,
    dead_replicas,
    place_replicas,
    replace_replica,
)


def test_a_new_shard_goes_to_three_distinct_least_loaded_nodes() -> None:
    shards = [ShardRecord(0, ("a", "b", "c"), 1), ShardRecord(1, ("a", "b", "d"), 1)]
    # load: a=2 b=2 c=1 d=1 e=0
    assert place_replicas(["a", "b", "c", "d", "e"], shards) == ("e", "c", "d")


def test_replicas_only_go_to_live_nodes_and_need_three() -> None:
    with pytest.raises(PlacementError):
        place_replicas(["a", "b"], [])
    assert set(place_replicas(["a", "b", "c"], [])) == {"a", "b", "c"}


def test_successive_shards_spread_evenly() -> None:
    nodes = ["a", "b", "c", "d"]
    shards: list[ShardRecord] = []
    for i in range(4):
        shards.append(ShardRecord(i, place_replicas(nodes, shards), 1))
    load = {n: sum(n in s.replicas for s in shards) for n in nodes}
    assert set(load.values()) == {3}


def test_a_queue_spreads_its_partitions_over_shards_least_loaded_first() -> None:
    queues = [QueueRecord("old", "q0", (0, 0, 1))]  # shard 0: 2, shard 1: 1, shard 2: 0
    assert assign_partitions([0, 1, 2], queues, 1) == (2,)
    assert assign_partitions([0, 1, 2], queues, 3) == (2, 1, 0)
    # More partitions than shards: every shard first, then the least loaded again.
    assert sorted(assign_partitions([0, 1], [], 4)) == [0, 0, 1, 1]


def test_assigning_needs_a_shard_and_a_partition() -> None:
    with pytest.raises(PlacementError):
        assign_partitions([], [], 1)
    with pytest.raises(PlacementError):
        assign_partitions([0], [], 0)


def test_a_dead_nodes_replica_moves_to_a_node_outside_the_group() -> None:
    shards = [ShardRecord(0, ("a", "b", "c"), 3), ShardRecord(1, ("b", "c", "d"), 1)]
    live = ["a", "b", "d", "e"]  # c died
    assert dead_replicas(shards, live) == [(0, "c"), (1, "c")]
    # For shard 0: d (1 replica) and e (0) are outside; e is less loaded.
    assert choose_replacement(shards[0], "c", live, shards) == "e"
    # For shard 1: only a and e are outside; e again.
    assert choose_replacement(shards[1], "c", live, shards) == "e"
    moved = replace_replica(shards[0], "c", "e")
    assert moved.replicas == ("a", "b", "e") and moved.epoch == 4


def test_no_replacement_when_every_live_node_already_holds_the_shard() -> None:
    shard = ShardRecord(0, ("a", "b", "c"), 1)
    with pytest.raises(PlacementError):
        choose_replacement(shard, "c", ["a", "b"], [shard])
    with pytest.raises(PlacementError):
        replace_replica(shard, "c", "a")
