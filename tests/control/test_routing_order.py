"""The order in which the gateway tries a shard's replicas (no network: the map is given)."""

from __future__ import annotations

from fixedmap import FixedMap
from sqsq.control.keys import LeaderHint, NodeRecord, ShardRecord
from sqsq.control.partition_map import MapSnapshot
from sqsq.gateway.routing import ShardCaller

NODES = {n: NodeRecord(n, f"10.0.0.{i}:7400", f"10.0.0.{i}:7500")
         for i, n in enumerate(("n1", "n2", "n3"), start=1)}


def _map(live: tuple[str, ...], hint: str | None) -> FixedMap:
    return FixedMap(MapSnapshot(
        nodes={n: NODES[n] for n in live}, members=NODES,
        shards={0: ShardRecord(0, ("n1", "n2", "n3"), 1)},
        leaders={0: LeaderHint(0, hint, 5)} if hint else {}))


def test_the_node_that_answered_last_goes_first_while_it_is_live() -> None:
    caller = ShardCaller(_map(("n1", "n2", "n3"), hint="n2"))  # type: ignore[arg-type]
    caller._answered[0] = (NODES["n3"].grpc_address, 5)  # (under the hint's term)
    assert caller.targets(0)[:2] == [NODES["n3"].grpc_address, NODES["n2"].grpc_address]


def test_a_leader_published_after_the_last_answer_goes_first() -> None:
    # n3 answered under term 4; n2 was elected in term 5 since (n3 frozen, say).
    caller = ShardCaller(_map(("n1", "n2", "n3"), hint="n2"))  # type: ignore[arg-type]
    caller._answered[0] = (NODES["n3"].grpc_address, 4)
    assert caller.targets(0)[0] == NODES["n2"].grpc_address


def test_a_node_whose_lease_expired_is_tried_last_even_if_it_answered_last() -> None:
    # n1 led and answered, then was cut off from everyone: its lease ran out and n2 leads.
    caller = ShardCaller(_map(("n2", "n3"), hint="n2"))  # type: ignore[arg-type]
    caller._answered[0] = (NODES["n1"].grpc_address, 5)
    assert caller.targets(0) == [NODES[n].grpc_address for n in ("n2", "n3", "n1")]
