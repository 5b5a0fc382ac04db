"""Leaders spread over the nodes: after a node is killed and comes back it leads nothing
(the others won every election meanwhile); the nodes hand leaderships over until none leads
two more than another, and ``cluster status`` shows how many each leads."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from serverproc import REPO
from sqsq.cli.cluster import LocalCluster
from sqsq.control.balance import LeaderMove, next_move
from sqsq.control.keys import LeaderHint, NodeRecord, ShardRecord
from sqsq.control.partition_map import MapSnapshot

SHARDS = 6


def _map(leaders: dict[int, str], live: tuple[str, ...] = ("n1", "n2", "n3"),
         replicas: dict[int, tuple[str, ...]] | None = None) -> MapSnapshot:
    nodes = {n: NodeRecord(n, f"{n}:1", f"{n}:100") for n in ("n1", "n2", "n3", "n4")}
    shards = {s: ShardRecord(s, (replicas or {}).get(s, ("n1", "n2", "n3")), 1)
              for s in range(SHARDS)}
    return MapSnapshot(nodes={n: nodes[n] for n in live}, members=nodes, shards=shards,
                       leaders={s: LeaderHint(s, n, 1) for s, n in leaders.items()})


def test_the_node_leading_most_hands_one_to_the_node_leading_fewest() -> None:
    bunched = _map({0: "n1", 1: "n1", 2: "n1", 3: "n2", 4: "n2", 5: "n2"})  # 3, 3, 0
    assert next_move(bunched, "n1") == LeaderMove(0, "n3")
    assert next_move(bunched, "n2") == LeaderMove(3, "n3")
    assert next_move(bunched, "n3") is None  # only an over-loaded node acts
    even = _map({0: "n1", 1: "n1", 2: "n2", 3: "n2", 4: "n3", 5: "n3"})
    assert all(next_move(even, n) is None for n in ("n1", "n2", "n3"))
    uneven = _map({0: "n1", 1: "n1", 2: "n1", 3: "n2", 4: "n2", 5: "n3"})  # 3, 2, 1
    assert next_move(uneven, "n1") == LeaderMove(0, "n3")
    assert next_move(uneven, "n2") is None  # one more than n3: within bounds
    off_by_one = _map({0: "n1", 1: "n1", 2: "n2", 3: "n2", 4: "n3", 5: "n3"},
                      live=("n1", "n2", "n3", "n4"),
                      replicas={s: ("n1", "n2", "n3") for s in range(SHARDS)})
    assert next_move(off_by_one, "n1") is None  # n4 leads none, but holds none of them


def test_no_move_while_a_shard_has_no_live_leader_or_to_a_node_without_its_replica() -> None:
    electing = _map({0: "n1", 1: "n1", 2: "n1", 3: "n2", 4: "n2"})  # shard 5: no hint
    assert next_move(electing, "n1") is None
    dead = _map({0: "n1", 1: "n1", 2: "n1", 3: "n2", 4: "n2", 5: "n2"}, live=("n1", "n2"))
    assert next_move(dead, "n1") is None  # n3 is down: it gets nothing
    elsewhere = _map({s: "n1" for s in range(SHARDS)}, live=("n1", "n2", "n3", "n4"),
                     replicas={s: ("n1", "n2", "n3") for s in range(SHARDS)})
    assert next_move(elsewhere, "n1") == LeaderMove(0, "n2")  # n4 holds none of them


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("balance"), nodes=3, shards=SHARDS).start()
    yield c
    c.stop()


def _leads(cluster: LocalCluster) -> dict[str, int]:
    status = cluster.status()
    return {n["id"]: len(n["leads"]) for n in status["nodes"] if n["alive"]}


def _until(check, timeout_s: float, what: str):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.2)
    return got


def test_leaders_spread_again_after_a_node_is_killed_and_restarted(
        cluster: LocalCluster) -> None:
    _until(lambda: sorted(_leads(cluster).values()) == [2, 2, 2], 60, "2 leaders each")
    victim = cluster.nodes[0]
    cluster.kill9(victim.proc)
    # the other two lead every shard, three each
    _until(lambda: sorted(_leads(cluster).values()) == [3, 3], 60, "3 leaders each on two")
    cluster.start_node(victim)
    cluster.wait_ready()
    leads = _until(lambda: (lambda d: d if sorted(d.values()) == [2, 2, 2] else None)(
        _leads(cluster)), 60, "the restarted node leading its share again")
    assert leads[victim.node_id] == 2
    out = subprocess.run([sys.executable, "-m", "sqsq.cli.main", "cluster", "status",
                          "--dir", str(cluster.root)], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert f"node {victim.node_id}: alive" in out.stdout and "leads 2 shards" in out.stdout
    status = json.loads(subprocess.run(
        [sys.executable, "-m", "sqsq.cli.main", "cluster", "status", "--dir",
         str(cluster.root), "--json"], capture_output=True, text=True, cwd=REPO,
        timeout=60).stdout)
    assert sorted(s for n in status["nodes"] for s in n["leads"]) == list(range(SHARDS))
