"""``sqsq backup`` of a running server and ``sqsq restore`` into a new one: every message
(bodies, attributes, in flight or not), the receipt-handle secret (a handle given out before
the backup still deletes its message) and the FIFO deduplication window come back as they
were; what was sent after the backup does not. The backup is streamed over the Admin API into
a directory of the test's, never read from the server's disk."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from serverproc import REPO, ServerProcess
from sqsq.cli.cluster import LocalCluster
from sqsq.client import Client
from sqsq.errors import ReceiptHandleIsInvalid

ATTRS = {"kind": {"DataType": "String", "StringValue": "order"},
         "n": {"DataType": "Number", "StringValue": "0"}}


def sqsq(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sqsq.cli.main", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def attrs(i: int) -> dict:
    return {**ATTRS, "n": {"DataType": "Number", "StringValue": str(i)}}


@dataclass
class Before:
    """What the first server held when it was backed up."""

    backup: Path
    bodies: dict[str, int]  # body -> i, standard queue, visible
    in_flight_body: str
    handle: str  # the in-flight message's receipt handle, from before the backup
    fifo: list[tuple[str, str]]  # (body, message id) in order


@pytest.fixture(scope="module")
def before(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Before]:
    root = tmp_path_factory.mktemp("backup")
    srv = ServerProcess(root / "data").start()
    try:
        with Client(srv.endpoint) as c:
            c.create_queue("orders")
            c.create_queue("jobs.fifo", {"FifoQueue": "true"})
            bodies = {f"order {i} " + "x" * i: i for i in range(20)}
            for body, i in bodies.items():
                c.send_message("orders", body, message_attributes=attrs(i))
            got = c.receive_message("orders", visibility_timeout=600)
            assert len(got) == 1
            in_flight = got[0]
            del bodies[in_flight.body]
            fifo = []
            for d in ("d1", "d2", "d3"):
                sent = c.send_message("jobs.fifo", f"job {d}", message_group_id="g",
                                      message_deduplication_id=d)
                fifo.append((f"job {d}", sent.message_id))
            out = sqsq("backup", "--endpoint", srv.endpoint, "--out", str(root / "backup"))
            assert out.returncode == 0, out.stderr
            # after the backup: not in it
            c.send_message("orders", "sent after the backup")
            c.send_message("jobs.fifo", "job d4", message_group_id="g",
                           message_deduplication_id="d4")
        assert not list((root / "data" / "snapshots").rglob("shard-*")), \
            "the server's checkpoint was not released"
    finally:
        srv.stop()
    yield Before(root / "backup", bodies, in_flight.body, in_flight.receipt_handle, fifo)


@pytest.fixture(scope="module")
def restored(before: Before, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("restored") / "data"
    out = sqsq("restore", "--from", str(before.backup), "--data-dir", str(data))
    assert out.returncode == 0, out.stderr
    srv = ServerProcess(data).start()
    yield srv
    srv.stop()


def test_the_backup_is_a_manifest_of_checked_files(before: Before) -> None:
    manifest = json.loads((before.backup / "manifest.json").read_text())
    assert manifest["kind"] == "server"
    [shard] = manifest["shards"]
    assert shard["shard_id"] == 0 and shard["applied_index"] > 0
    for name, f in shard["files"].items():
        assert (before.backup / shard["dir"] / name).stat().st_size == f["size"]
    assert (before.backup / "secret").stat().st_mode & 0o777 == 0o600


def test_every_message_comes_back_with_its_attributes(before: Before,
                                                      restored: ServerProcess) -> None:
    with Client(restored.endpoint) as c:
        counts = c.get_queue_attributes("orders", ["All"])
        assert counts["ApproximateNumberOfMessages"] == str(len(before.bodies))
        assert counts["ApproximateNumberOfMessagesNotVisible"] == "1"
        seen: dict[str, dict] = {}
        while len(seen) < len(before.bodies):
            got = c.receive_message("orders", 10, visibility_timeout=600,
                                    message_attribute_names=["All"])
            assert got, f"only {len(seen)} of {len(before.bodies)} messages came back"
            seen.update({m.body: m.message_attributes for m in got})
        assert set(seen) == set(before.bodies)  # nothing sent after the backup
        for body, i in before.bodies.items():
            assert seen[body] == attrs(i)


def test_a_handle_from_before_the_backup_still_deletes(before: Before,
                                                       restored: ServerProcess) -> None:
    def in_flight(c: Client) -> int:
        counts = c.get_queue_attributes("orders", ["ApproximateNumberOfMessagesNotVisible"])
        return int(counts["ApproximateNumberOfMessagesNotVisible"])

    with Client(restored.endpoint) as c:
        forged = before.handle[:-4] + ("AAAA" if not before.handle.endswith("AAAA") else "BBBB")
        with pytest.raises(ReceiptHandleIsInvalid):
            c.delete_message("orders", forged)
        was = in_flight(c)
        c.delete_message("orders", before.handle)
        assert in_flight(c) == was - 1


def test_the_fifo_dedup_window_survives(before: Before, restored: ServerProcess) -> None:
    with Client(restored.endpoint) as c:
        again = c.send_message("jobs.fifo", "job d2, sent again", message_group_id="g",
                               message_deduplication_id="d2")
        assert again.message_id == before.fifo[1][1]  # deduplicated: the first one's id
        got = c.receive_message("jobs.fifo", 10, visibility_timeout=600)
        assert [(m.body, m.message_id) for m in got] == before.fifo
        fresh = c.send_message("jobs.fifo", "job d4 after restore", message_group_id="g",
                               message_deduplication_id="d4")
        assert fresh.message_id not in {mid for _, mid in before.fifo}


def test_restore_refuses_existing_data_and_damaged_backups(before: Before,
                                                           tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert sqsq("restore", "--from", str(before.backup), "--data-dir", str(data)
                ).returncode == 0
    again = sqsq("restore", "--from", str(before.backup), "--data-dir", str(data))
    assert again.returncode == 1 and "already holds a server's data" in again.stderr
    # a flipped byte in a checkpoint file is found before anything is written
    damaged = tmp_path / "damaged"
    subprocess.run(["cp", "-r", str(before.backup), str(damaged)], check=True)
    victim = max((p for p in (damaged / "shard-0").iterdir() if p.is_file()),
                 key=lambda p: p.stat().st_size)
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))
    out = sqsq("restore", "--from", str(damaged), "--data-dir", str(tmp_path / "other"))
    assert out.returncode == 1 and "differ from the manifest" in out.stderr
    assert not (tmp_path / "other" / "shard-0").exists()
    (damaged / "manifest.json").unlink()
    out = sqsq("restore", "--from", str(damaged), "--data-dir", str(tmp_path / "third"))
    assert out.returncode == 1 and "incomplete" in out.stderr


def test_a_cluster_backup_restores_into_a_new_cluster(tmp_path: Path) -> None:
    """Two shards, a queue partitioned over both: backed up through the gateway (each
    shard's checkpoint from its leader, the partition map), restored into a new cluster
    (new etcd, new ports), where the queues, messages, a handle and a dedup id work."""
    old = LocalCluster(tmp_path / "old", shards=2, partitions=2).start()
    try:
        with Client(old.gateway.endpoint, timeout=30) as c:
            c.create_queue("orders")
            c.create_queue("jobs.fifo", {"FifoQueue": "true"})
            bodies = {f"order {i}": i for i in range(20)}
            for body, i in bodies.items():
                c.send_message("orders", body, message_attributes=attrs(i))
            [in_flight] = c.receive_message("orders", visibility_timeout=600)
            del bodies[in_flight.body]
            first = c.send_message("jobs.fifo", "job d1", message_group_id="g",
                                   message_deduplication_id="d1")
        layout = {q["name"]: q["partitions"] for q in old.status()["queues"]}
        assert sorted(layout["orders"]) == [0, 1]
        out = sqsq("backup", "--endpoint", old.gateway.endpoint, "--out",
                   str(tmp_path / "backup"))
        assert out.returncode == 0, out.stderr
    finally:
        old.stop()
    manifest = json.loads((tmp_path / "backup" / "manifest.json").read_text())
    assert manifest["kind"] == "cluster" and len(manifest["shards"]) == 2
    out = sqsq("restore", "--from", str(tmp_path / "backup"), "--cluster-dir",
               str(tmp_path / "new"))
    assert out.returncode == 0, out.stderr
    new = LocalCluster(tmp_path / "new", shards=2, partitions=2).start()
    try:
        assert {q["name"]: q["partitions"] for q in new.status()["queues"]} == layout
        with Client(new.gateway.endpoint, timeout=30) as c:
            seen: dict[str, dict] = {}
            deadline = time.monotonic() + 30
            while len(seen) < len(bodies) and time.monotonic() < deadline:
                for m in c.receive_message("orders", 10, visibility_timeout=600,
                                           message_attribute_names=["All"]):
                    seen[m.body] = m.message_attributes
            assert seen == {body: attrs(i) for body, i in bodies.items()}
            def not_visible() -> int:
                return int(c.get_queue_attributes(
                    "orders", ["ApproximateNumberOfMessagesNotVisible"]
                )["ApproximateNumberOfMessagesNotVisible"])

            was = not_visible()
            c.delete_message("orders", in_flight.receipt_handle)
            assert not_visible() == was - 1
            again = c.send_message("jobs.fifo", "job d1 again", message_group_id="g",
                                   message_deduplication_id="d1")
            assert again.message_id == first.message_id
            [job] = c.receive_message("jobs.fifo", 10, visibility_timeout=600)
            assert (job.body, job.message_id) == ("job d1", first.message_id)
    finally:
        new.stop()
