"""Three ``sqsq node`` processes, one shard's Raft group: what users of a replicated queue
rely on when a node dies, stops, loses its disk, or all of them restart."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from clusterproc import Cluster, receipt_entries
from clusterproc import drain as drain_queue
from sqsq.client import Client
from sqsq.errors import QueueError


@pytest.fixture
def cluster(tmp_path: Path):  # noqa: ANN201
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        for node in c.nodes:
            c.kill9(node)


class Load:
    """Senders and a receiver-deleter on one queue; every acknowledged send is recorded."""

    def __init__(self, cluster: Cluster, url: str, senders: int = 3) -> None:
        self.cluster, self.url = cluster, url
        self.acked: dict[str, float] = {}
        self.attempted: set[str] = set()  # sent, acknowledged or not
        self.received: set[str] = set()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._send, args=(i,)) for i in range(senders)]
        self.threads.append(threading.Thread(target=self._receive))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def _send(self, tid: int) -> None:
        with self.cluster.client(timeout=10) as c:
            i = 0
            while not self.stop.is_set():
                body = f"{tid}-{i}"
                i += 1
                self.attempted.add(body)
                try:
                    c.send_message(self.url, body)
                except QueueError:
                    continue  # not acknowledged: may or may not exist, never counted
                with self.lock:
                    self.acked[body] = time.monotonic()

    def _receive(self) -> None:
        with self.cluster.client(timeout=10) as c:
            while not self.stop.is_set():
                try:
                    got = c.receive_message(self.url, max_number_of_messages=10)
                    self.received.update(m.body for m in got)
                    if got:
                        c.delete_message_batch(self.url, receipt_entries(got))
                except QueueError:
                    time.sleep(0.05)

    def longest_gap_after(self, t0: float) -> float:
        """The longest time without an acknowledged send, from ``t0`` on."""
        times = sorted(t for t in self.acked.values() if t >= t0)
        if not times:
            return float("inf")
        gaps = [times[0] - t0] + [b - a for a, b in zip(times, times[1:], strict=False)]
        return max(gaps)


def drain(client: Client, url: str, into: set[str]) -> None:
    """Receive and delete until the queue is empty (in-flight messages come back quickly:
    the queue's visibility timeout is 1 s, and the drain stops after three empty 1 s long
    polls in a row)."""
    into.update(drain_queue(client, url))


def test_kill_9_of_the_leader_under_load_loses_no_acknowledged_send(cluster: Cluster) -> None:
    cluster.start_all(bootstrap=True)
    with cluster.client() as c:
        url = c.create_queue("orders", attributes={"VisibilityTimeout": "1"})
        held = c.create_queue("held", attributes={"VisibilityTimeout": "1"})
        c.send_message(held, "fenced")
        first = c.receive_message(held)[0]  # its handle goes stale after the failover
        with Load(cluster, url) as load:
            time.sleep(2.0)
            leader = cluster.leader()
            killed_at = time.monotonic()
            cluster.kill9(leader)
            time.sleep(4.0)
            gap = load.longest_gap_after(killed_at)
            cluster.start(leader)  # it rejoins with its journal
            time.sleep(2.0)
        received = set(load.received)
        drain(c, url, received)
        # The new leader holds the receive count: a redelivery supersedes the first handle.
        again = c.receive_message(held, wait_time_seconds=5)
        assert [m.body for m in again] == ["fenced"]
        with pytest.raises(QueueError):
            c.delete_message(held, first.receipt_handle)
        c.delete_message(held, again[0].receipt_handle)
        lost = set(load.acked) - received
        print(f"\nfailover: {len(load.acked)} sends acknowledged, longest gap after the kill "
              f"{gap:.2f}s, lost {len(lost)}")
        assert len(load.acked) > 50
        assert not lost, f"acknowledged sends lost: {sorted(lost)[:10]}"
        assert gap < 15.0, "no new leader served within 15 s"
        assert received <= load.attempted, "a message nobody sent was delivered"


def _until(done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_leader_stopped_gracefully_hands_over_first_and_loses_nothing(
        cluster: Cluster) -> None:
    """SIGTERM on the leader: before it stops, it hands leadership to a caught-up follower
    (its log says which), that follower leads, and no acknowledged send is lost."""
    cluster.start_all(bootstrap=True)
    with cluster.client() as c:
        url = c.create_queue("handover", attributes={"VisibilityTimeout": "1"})
        with Load(cluster, url) as load:
            _until(lambda: len(load.acked) > 50)
            leader = cluster.leader()
            cluster.stop(leader)
            assert leader.proc is not None and leader.proc.returncode == 0
            successor = cluster.leader()
            before = len(load.acked)
            _until(lambda: len(load.acked) > before + 50)
        received = set(load.received)
        drain(c, url, received)
    log = (cluster.root / f"{leader.root.name}.log").read_text()
    assert f"shard 0: leadership handed to 127.0.0.1:{successor.raft_port} before stopping" \
        in log, log[-2000:]
    lost = set(load.acked) - received
    assert not lost, f"acknowledged sends lost: {sorted(lost)[:10]}"
    assert received <= load.attempted


def test_a_leader_resumed_after_a_new_election_acknowledges_nothing_new(
        cluster: Cluster) -> None:
    cluster.start_all(bootstrap=True)
    with cluster.client() as c:
        url = c.create_queue("q", attributes={"VisibilityTimeout": "1"})
        c.send_message(url, "before")
        old = cluster.leader()
        cluster.pause(old)
        outcome: list = []

        def send_to_the_old_leader() -> None:
            with Client(old.endpoint, timeout=20) as pinned:
                try:
                    pinned.send_message(url, "to-the-stopped-leader")
                    outcome.append("acknowledged")
                except QueueError as e:
                    outcome.append(e.code)

        t = threading.Thread(target=send_to_the_old_leader)
        t.start()
        time.sleep(0.5)
        c.send_message(url, "during")  # served by the new leader
        new = cluster.leader()
        assert new is not old
        cluster.resume(old)
        t.join(timeout=60)
        received: set[str] = set()
        drain(c, url, received)
        assert {"before", "during"} <= received
        # Whatever the stopped leader answered once resumed, it did not acknowledge a send
        # that the group does not hold.
        assert outcome, "the send to the stopped leader never returned"
        if outcome[0] == "acknowledged":
            assert "to-the-stopped-leader" in received
        with Client(old.endpoint, timeout=10) as pinned:
            pinned.list_queues()
            assert pinned.target == new.endpoint  # it follows; it no longer leads


def test_replicas_converge_and_a_wiped_replica_rejoins(cluster: Cluster) -> None:
    cluster.start_all(bootstrap=True)
    with cluster.client() as c:
        url = c.create_queue("q")
        fifo = c.create_queue("f.fifo", attributes={"FifoQueue": "true",
                                                     "ContentBasedDeduplication": "true"})
        for i in range(40):
            c.send_message(url, f"m{i}")
            c.send_message(fifo, f"f{i}", message_group_id=f"g{i % 3}")
        for m in c.receive_message(url, max_number_of_messages=10):
            c.delete_message(url, m.receipt_handle)
        leader = cluster.leader()
        wiped = next(n for n in cluster.nodes if n is not leader)
        cluster.stop(wiped)
        cluster.wipe(wiped)
        for i in range(10):
            c.send_message(url, f"after-{i}")
        cluster.start(wiped)  # no --bootstrap: it learns the group from the leader
        deadline = time.monotonic() + 30
        while "caught up" not in cluster.log_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "caught up" in cluster.log_text()
        c.send_message(url, "last")
        time.sleep(1.5)  # heartbeats carry the last commit index to every follower
    cluster.stop_all()
    digests = cluster.digests()
    assert len({d for d, _ in digests}) == 1, digests
    assert digests[0][1] > 90


def test_all_three_killed_after_compaction_come_back_with_every_message(
        tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, extra_args=("--compaction-entries", "20"))
    try:
        cluster.start_all(bootstrap=True)
        with cluster.client() as c:
            url = c.create_queue("q", attributes={"VisibilityTimeout": "1"})
            sent = set()
            for i in range(150):
                c.send_message(url, f"m{i}")
                sent.add(f"m{i}")
        for node in cluster.nodes:
            snapshots = node.root / "shard-0" / "raft" / "snapshots"
            assert list(snapshots.glob("*.snap")), "no log compaction"
            cluster.kill9(node)
        cluster.start_all()
        with cluster.client() as c:
            received: set[str] = set()
            drain(c, url, received)
        assert received == sent
    finally:
        for node in cluster.nodes:
            cluster.kill9(node)
