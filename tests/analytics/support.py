"""Shared by the analytics tests: the workload record, readers for export and report outputs
(pyarrow: no Spark needed to check files), and the setups begun ahead of the tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from serverproc import ServerProcess

REPO = Path(__file__).resolve().parents[2]
ARN = "arn:aws:sqs:us-east-1:000000000000:"
CLUSTER_SHARDS = 2  # test_cluster_reports's cluster: its shards, and each queue's partitions


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


class HeadStart:
    """Setups run on a thread of their own, begun before a test asks for them: ``plan`` names
    one, ``begin`` starts it (one at a time, in the order begun), ``result`` waits for it
    (beginning it if nobody did) and raises what it raised. ``close`` waits for what runs,
    drops what has not begun, and undoes each setup that succeeded with its ``stop``, last
    first."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="head-start")
        self._plans: dict[str, tuple[Callable[[], Any], Callable[[Any], object]]] = {}
        self._started: dict[str, tuple[Future, Callable[[Any], object]]] = {}

    def plan(self, name: str, fn: Callable[[], Any], stop: Callable[[Any], object]) -> None:
        self._plans[name] = (fn, stop)

    def begin(self, name: str) -> None:
        if name not in self._started:
            fn, stop = self._plans[name]
            self._started[name] = (self._pool.submit(fn), stop)

    def result(self, name: str) -> Any:
        self.begin(name)
        return self._started[name][0].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for future, stop in reversed(self._started.values()):
            if not future.cancelled() and future.exception() is None:
                stop(future.result())
