"""The export against the workload: states as of each snapshot, layout, manifest, data-dir."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from analytics.support import ARN, Workload, export_rows, states
from sqsq.analytics.export import export_data_dir


def test_layout_and_manifest(workload: Workload) -> None:
    manifest = json.loads((workload.export_dir / "manifest.json").read_text())
    assert [s["snapshot_ms"] for s in manifest["snapshots"]] == workload.snapshots
    assert workload.snapshots[0] < workload.snapshots[1]
    for snap in manifest["snapshots"]:
        (shard,) = snap["shards"]
        assert shard["shard"] == 0 and shard["applied_index"] > 0
        for name in ("queues", "messages", "delivery"):
            part = f"{name}/snapshot_ms={snap['snapshot_ms']}/shard=0/part-0.parquet"
            assert shard["files"][name] == part
            assert (workload.export_dir / part).is_file()
    assert manifest["snapshots"][0]["shards"][0]["messages"] == 12
    assert manifest["snapshots"][1]["shards"][0]["messages"] == 14


def test_first_snapshot_states(workload: Workload) -> None:
    delivery = export_rows(workload.export_dir, "delivery", workload.snapshots[0])
    assert states(delivery) == {
        "jobs": Counter(VISIBLE=3, IN_FLIGHT=2, DELAYED=2),
        "orders": Counter(VISIBLE=1),
        "dlq": Counter(VISIBLE=3, IN_FLIGHT=1),
    }
    # visibility-0 receives leave due timers: whatever the sweeper did, they read as VISIBLE
    assert {r["stored_state"] for r in delivery if r["queue_name"] == "dlq"} <= {
        "VISIBLE", "IN_FLIGHT"}
    dlq = {r["message_id"]: r for r in delivery if r["queue_name"] == "dlq"}
    assert dlq[workload.dlq_in_flight_id]["state"] == "IN_FLIGHT"
    assert dlq[workload.dlq_in_flight_id]["receive_count"] == 2
    assert sorted(r["receive_count"] for r in dlq.values()) == [1, 1, 1, 2]


def test_messages_columns(workload: Workload) -> None:
    snap = workload.snapshots[0]
    messages = export_rows(workload.export_dir, "messages", snap)
    assert all(r["body"] is None for r in messages)  # bodies only when asked for
    assert all(r["partition"] == 0 and r["shard"] == 0 for r in messages)
    dead = [r for r in messages if r["queue_name"] == "dlq"]
    assert Counter(r["dead_letter_source_arn"] for r in dead) == {
        ARN + "orders": 3, ARN + "billing": 1}
    assert all(r["sent_ms"] <= r["dead_lettered_ms"] <= snap for r in dead)
    assert Counter(r["group_id"] for r in dead) == {"tenant-a": 2, "tenant-b": 1, "tenant-c": 1}
    assert Counter(dict(r["attributes"])["kind"] for r in dead) == {"bad": 3, "timeout": 1}
    fresh = next(r for r in messages if r["queue_name"] == "orders")
    assert fresh["body_size_bytes"] == fresh["size_bytes"] == len("order-fresh")
    queues = {r["queue_name"]: r for r in export_rows(workload.export_dir, "queues", snap)}
    assert set(queues) == {"dlq", "jobs", "orders", "billing"}
    assert queues["dlq"]["is_dead_letter_queue"] and not queues["jobs"]["is_dead_letter_queue"]
    assert queues["orders"]["max_receive_count"] == 1
    assert queues["orders"]["dead_letter_target_arn"] == ARN + "dlq"
    assert dict(queues["orders"]["attributes"])["MessageRetentionPeriod"] == "345600"


def test_second_snapshot_states(workload: Workload) -> None:
    delivery = export_rows(workload.export_dir, "delivery", workload.snapshots[1])
    assert states(delivery) == {
        "jobs": Counter(VISIBLE=7, IN_FLIGHT=1, DELAYED=2),
        "dlq": Counter(VISIBLE=3, IN_FLIGHT=1),
    }


def test_running_server_dir_is_refused(workload: Workload) -> None:
    assert "in use by a running server" in workload.locked_error
    assert "--endpoint" in workload.locked_error


def test_data_dir_export_of_stopped_server(workload: Workload, tmp_path: Path) -> None:
    entry = export_data_dir(workload.data_dir, tmp_path, include_bodies=True)
    delivery = export_rows(tmp_path, "delivery", entry["snapshot_ms"])
    assert states(delivery) == {
        "jobs": Counter(VISIBLE=7, IN_FLIGHT=1, DELAYED=2),
        "dlq": Counter(VISIBLE=3, IN_FLIGHT=1),
    }
    messages = export_rows(tmp_path, "messages", entry["snapshot_ms"])
    assert Counter(r["body"] for r in messages if r["queue_name"] == "jobs")["later-0"] == 1
    assert not list((workload.data_dir / "snapshots").glob("export-*"))  # checkpoint removed
