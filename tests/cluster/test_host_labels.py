"""Several nodes per machine, placed apart: a node carries a host label (``--host-label``,
by default the address it advertises), and no shard has two replicas on one host, when its
shards are placed and when a dead node's replicas are given to others."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sqsq.cli.cluster import LocalCluster
from sqsq.control import keys
from sqsq.control.keys import NodeRecord, ShardRecord
from sqsq.control.placement import PlacementError, choose_replacement, place_replicas

HOSTS = {"a1": "A", "a2": "A", "b1": "B", "b2": "B", "c1": "C", "c2": "C"}


def test_replicas_are_placed_on_three_hosts_and_replaced_on_the_dead_ones_host() -> None:
    placed: list[ShardRecord] = []
    for shard_id in range(6):
        replicas = place_replicas(HOSTS, placed, hosts=HOSTS)
        assert sorted(HOSTS[n] for n in replicas) == ["A", "B", "C"]
        placed.append(ShardRecord(shard_id, replicas, 1))
    assert all(sum(n in s.replicas for s in placed) == 3 for n in HOSTS)  # evenly loaded
    shard = ShardRecord(9, ("a1", "b1", "c1"), 1)
    live = [n for n in HOSTS if n != "b1"]
    assert choose_replacement(shard, "b1", live, placed, hosts=HOSTS) == "b2"
    with pytest.raises(PlacementError, match="--host-label"):
        place_replicas(["a1", "a2", "b1", "b2"], [], hosts=HOSTS)  # two hosts only
    with pytest.raises(PlacementError):
        choose_replacement(shard, "b1", ["a1", "a2", "c1", "c2"], placed, hosts=HOSTS)


def test_a_node_record_carries_its_host_label_and_defaults_to_its_address() -> None:
    labelled = NodeRecord("n1", "10.0.0.1:7500", "10.0.0.1:7600", "rack1-host3")
    assert keys.decode_node(keys.encode(labelled)) == labelled
    assert labelled.host_label == "rack1-host3"
    plain = NodeRecord("n2", "10.0.0.2:7500", "10.0.0.2:7600")
    assert b"host" not in keys.encode(plain)  # records written before labels read the same
    assert keys.decode_node(keys.encode(plain)).host_label == "10.0.0.2"


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("hosts"), nodes=6, nodes_per_host=2, shards=4,
                     node_args=("--replace-after", "3")).start()
    yield c
    c.stop()


def test_six_nodes_on_three_hosts_keep_each_shard_on_three_hosts(
        cluster: LocalCluster) -> None:
    def hosts_of(status: dict) -> dict[int, list[str]]:
        host = {n["id"]: n["host"] for n in status["nodes"]}
        return {s["id"]: sorted(host[r] for r in s["replicas"]) for s in status["shards"]}

    status = cluster.status()
    assert {n["id"]: n["host"] for n in status["nodes"]} == {
        "n1": "host1", "n2": "host1", "n3": "host2", "n4": "host2", "n5": "host3",
        "n6": "host3"}
    assert all(h == ["host1", "host2", "host3"] for h in hosts_of(status).values())
    held = [s["id"] for s in status["shards"] if "n1" in s["replicas"]]
    assert held
    cluster.kill9(cluster.nodes[0].proc)
    deadline = time.monotonic() + 90
    while True:  # n1's replicas go to the one node left on host1: n2
        status = cluster.status()
        moved = {s["id"]: s for s in status["shards"] if s["id"] in held}
        if all("n1" not in s["replicas"] and "n2" in s["replicas"] for s in moved.values()):
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.3)
    assert all(h == ["host1", "host2", "host3"] for h in hosts_of(status).values())
