"""Shared by the analytics tests: the workload record and readers for export and report
outputs (pyarrow: no Spark needed to check files)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from serverproc import ServerProcess

REPO = Path(__file__).resolve().parents[2]
ARN = "arn:aws:sqs:us-east-1:000000000000:"


@dataclass
class Workload:
    export_dir: Path
    data_dir: Path
    server: ServerProcess
    snapshots: list[int] = field(default_factory=list)
    dlq_in_flight_id: str = ""
    locked_error: str = ""


def export_rows(export_dir: Path, name: str, snapshot_ms: int) -> list[dict[str, Any]]:
    partitioning = ds.partitioning(
        pa.schema([("snapshot_ms", pa.int64()), ("shard", pa.int32())]), flavor="hive")
    dataset = ds.dataset(export_dir / name, format="parquet", partitioning=partitioning)
    table = dataset.to_table(filter=ds.field("snapshot_ms") == snapshot_ms)
    return table.to_pylist()


def table_rows(report_dir: Path, name: str) -> list[dict[str, Any]]:
    return pq.read_table(report_dir / "tables" / f"{name}.parquet").to_pylist()


def by(rows: list[dict[str, Any]], *keys: str) -> dict[Any, dict[str, Any]]:
    return {tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in rows}


def states(delivery: list[dict[str, Any]]) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    for r in delivery:
        out.setdefault(r["queue_name"], Counter())[r["state"]] += 1
    return out


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
