"""/healthz and /readyz: a node is ready while it hears from its shard's leader, not ready
while no leader can be elected (two of three nodes stopped), ready again after the election."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterproc import Cluster
from ops.opssupport import readyz, until


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    c.start_all(bootstrap=True)
    yield c
    c.stop_all()


def _url(node) -> str:  # noqa: ANN001 - a clusterproc Node
    return f"http://127.0.0.1:{node.metrics_port}"


def test_readyz_follows_the_shards_leader(group: Cluster) -> None:
    for node in group.nodes:
        until(f"{node.endpoint} ready", lambda n=node: readyz(_url(n))[0] == 200)
    with urllib.request.urlopen(f"{_url(group.nodes[0])}/healthz", timeout=10) as r:
        assert r.status == 200 and json.loads(r.read()) == {"alive": True}
    status, body = readyz(_url(group.nodes[0]))
    assert (status, body) == (200, {"ready": True, "problems": []})

    # Stop the leader and one follower: the one left cannot elect anyone.
    leader = group.leader()
    others = [n for n in group.nodes if n is not leader]
    left, stopped = others[0], [leader, others[1]]
    for node in stopped:
        group.pause(node)
    try:
        def not_ready() -> dict | None:
            status, body = readyz(_url(left))
            return body if status == 503 else None

        body = until("the lone node not ready", not_ready)
        assert isinstance(body, dict) and body["ready"] is False
        assert any("shard 0: no leader" in p for p in body["problems"]), body
    finally:
        for node in stopped:
            group.resume(node)
    # An election (or the old leader back in touch), and it is ready again.
    until("ready after the election", lambda: readyz(_url(left))[0] == 200)
    group.leader()
    for node in group.nodes:
        until(f"{node.endpoint} ready again", lambda n=node: readyz(_url(n))[0] == 200)
