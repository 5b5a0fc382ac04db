"""The export's on-disk layout: hive-partitioned Parquet datasets and a manifest.

    OUT/queues/snapshot_ms=<ms>/shard=<n>/part-0.parquet
    OUT/messages/snapshot_ms=<ms>/shard=<n>/part-0.parquet
    OUT/delivery/snapshot_ms=<ms>/shard=<n>/part-0.parquet
    OUT/manifest.json

The partition columns live in the directory names only (Spark and pyarrow rebuild them from
the path; a copy inside the files would clash with them). Schemas are fixed here so that every
snapshot and shard writes identical types, even for all-null columns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

FORMAT = "sqsq-snapshot-export"
VERSION = 1
DATASETS = ("queues", "messages", "delivery")
PARTITIONING = ("snapshot_ms", "shard")
BATCH_ROWS = 50_000  # rows buffered per Parquet row group: bounds the exporter's memory

_STR_MAP = pa.map_(pa.string(), pa.string())

SCHEMAS: dict[str, pa.Schema] = {
    "queues": pa.schema([
        ("as_of_ms", pa.int64()), ("qid", pa.int64()), ("queue_name", pa.string()),
        ("queue_arn", pa.string()), ("fifo", pa.bool_()), ("created_ms", pa.int64()),
        ("modified_ms", pa.int64()), ("visibility_timeout_s", pa.int64()),
        ("delay_seconds", pa.int64()), ("message_retention_period_s", pa.int64()),
        ("maximum_message_size", pa.int64()), ("receive_message_wait_time_s", pa.int64()),
        ("dead_letter_target_arn", pa.string()), ("max_receive_count", pa.int64()),
        ("dead_letter_target_exists", pa.bool_()), ("is_dead_letter_queue", pa.bool_()),
        ("redrive_allow_policy", pa.string()), ("content_based_deduplication", pa.bool_()),
        ("deduplication_scope", pa.string()), ("fifo_throughput_limit", pa.string()),
        ("last_purge_ms", pa.int64()), ("attributes", _STR_MAP), ("tags", _STR_MAP),
    ]),
    "messages": pa.schema([
        ("as_of_ms", pa.int64()), ("partition", pa.int32()), ("qid", pa.int64()),
        ("seq", pa.int64()), ("queue_name", pa.string()), ("message_id", pa.string()),
        ("sent_ms", pa.int64()), ("size_bytes", pa.int64()), ("body_size_bytes", pa.int64()),
        ("md5_of_body", pa.string()), ("group_id", pa.string()),
        ("deduplication_id", pa.string()), ("attributes", _STR_MAP),
        ("attribute_types", _STR_MAP), ("dead_letter_source_arn", pa.string()),
        ("dead_lettered_ms", pa.int64()), ("body", pa.string()),
    ]),
    "delivery": pa.schema([
        ("as_of_ms", pa.int64()), ("partition", pa.int32()), ("qid", pa.int64()),
        ("seq", pa.int64()), ("queue_name", pa.string()), ("message_id", pa.string()),
        ("state", pa.string()), ("stored_state", pa.string()), ("receive_count", pa.int64()),
        ("first_receive_ms", pa.int64()), ("visible_at_ms", pa.int64()),
    ]),
}


def part_path(out: Path, dataset: str, snapshot_ms: int, shard: int) -> Path:
    return out / dataset / f"snapshot_ms={snapshot_ms}" / f"shard={shard}" / "part-0.parquet"


class PartWriter:
    """Streams rows of one dataset partition into one Parquet file, atomically renamed."""

    def __init__(self, out: Path, dataset: str, snapshot_ms: int, shard: int) -> None:
        self.path = part_path(out, dataset, snapshot_ms, shard)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(".part-0.parquet.tmp")
        self.schema = SCHEMAS[dataset]
        self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="zstd")
        self._rows: list[dict[str, Any]] = []
        self.count = 0

    def add(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        if len(self._rows) >= BATCH_ROWS:
            self._flush()

    def extend(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self.add(row)

    def _flush(self) -> None:
        # an empty table is still written once, so an idle shard has a file with the schema
        if self._rows or self.count == 0:
            self._writer.write_table(pa.Table.from_pylist(self._rows, schema=self.schema))
            self.count += len(self._rows)
            self._rows = []

    def close(self) -> None:
        self._flush()
        self._writer.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._writer.close()
        self._tmp.unlink(missing_ok=True)


def read_manifest(out: Path) -> dict[str, Any]:
    path = out / "manifest.json"
    if path.exists():
        manifest = json.loads(path.read_text())
        if manifest.get("format") != FORMAT:
            raise ValueError(f"{path} is not an sqsq export manifest")
        return manifest
    return {
        "format": FORMAT, "version": VERSION, "partitioning": list(PARTITIONING),
        "datasets": {
            name: {"path": name, "columns": [f.name for f in SCHEMAS[name]]} for name in DATASETS
        },
        "snapshots": [],
    }


def record_snapshot(out: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """Add (or replace) one snapshot's entry in OUT/manifest.json, written atomically."""
    manifest = read_manifest(out)
    kept = [s for s in manifest["snapshots"] if s["snapshot_ms"] != entry["snapshot_ms"]]
    manifest["snapshots"] = sorted([*kept, entry], key=lambda s: s["snapshot_ms"])
    tmp = out / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out / "manifest.json")
    return manifest
