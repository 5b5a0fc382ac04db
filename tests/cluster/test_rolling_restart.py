"""``sqsq cluster restart --rolling`` under load: ``sqsq cluster up`` runs a three-node,
two-shard cluster, SDK clients send and receive+delete through its gateway the whole time,
and every node is restarted in turn, the shards' leaders last. Nothing acknowledged is lost
and the clients see no error at all (what a restart costs is retried inside the SDK)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clusterup import ClusterUp
from serverproc import REPO, free_port
from sqsq.client import Client

QUEUE = "rolling"


def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.1)


@pytest.fixture
def cluster_up(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A running ``sqsq cluster up`` (its directory, its gateway's gRPC address)."""
    up = ClusterUp(tmp_path / "cluster", "--shards", "2", "--partitions", "2",
                   "--grpc-port", str(free_port()), "--http-port", str(free_port()))
    try:
        up.start()
        yield up.root, up.endpoint
    finally:
        up.stop()


def test_a_rolling_restart_under_load_loses_nothing_and_shows_no_error(
        cluster_up: tuple[Path, str]) -> None:
    root, endpoint = cluster_up
    with Client(endpoint, timeout=30) as c:
        c.create_queue(QUEUE, {"VisibilityTimeout": "30"})
    acknowledged: list[str] = []
    received: set[str] = set()
    errors: list[tuple[str, Exception]] = []
    stop = threading.Event()

    def send(n: int) -> None:
        with Client(endpoint, timeout=30) as client:
            i = 0
            while not stop.is_set():
                try:
                    client.send_message(QUEUE, f"{n}-{i}")
                    acknowledged.append(f"{n}-{i}")
                except Exception as exc:  # noqa: BLE001 - any error the client saw counts
                    errors.append(("send", exc))
                i += 1

    def receive() -> None:
        with Client(endpoint, timeout=30) as client:
            while not stop.is_set():
                try:
                    for m in client.receive_message(QUEUE, 10, wait_time_seconds=1):
                        client.delete_message(QUEUE, m.receipt_handle)
                        received.add(m.body)
                except Exception as exc:  # noqa: BLE001
                    errors.append(("receive or delete", exc))

    threads = [threading.Thread(target=send, args=(n,)) for n in range(2)]
    threads.append(threading.Thread(target=receive))
    for t in threads:
        t.start()
    try:
        _until(lambda: len(acknowledged) >= 50, 30, "the load running")
        before = len(acknowledged)
        out = subprocess.run([sys.executable, "-m", "sqsq.cli.main", "cluster", "restart",
                              "--rolling", "--dir", str(root)], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        _until(lambda: len(acknowledged) >= before + 100, 30, "the load going on after")
    finally:
        stop.set()
        for t in threads:
            t.join()
    steps = json.loads((root / "restart.json").read_text())["steps"]
    assert sorted(s["node"] for s in steps) == ["n1", "n2", "n3"]
    leaders = [s["was_leader"] for s in steps]
    assert leaders == sorted(leaders), f"a leader went before a node leading nothing: {steps}"
    assert "rolling restart done: 3 nodes" in out.stdout
    pids = {n["id"]: n["pid"] for n in json.loads((root / "cluster.json").read_text())["nodes"]}
    assert len(set(pids.values())) == 3

    with Client(endpoint, timeout=30) as client:
        def drained() -> bool:
            for m in client.receive_message(QUEUE, 10, wait_time_seconds=1):
                client.delete_message(QUEUE, m.receipt_handle)
                received.add(m.body)
            return set(acknowledged) <= received
        _until(drained, 60, "every acknowledged message received")
    assert errors == [], [(op, repr(e)) for op, e in errors]
