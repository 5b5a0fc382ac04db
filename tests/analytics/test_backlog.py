"""The backlog report on local Spark, checked against the workload (see conftest)."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path

import pytest

from analytics.support import Workload, by, export_rows, is_png, table_rows


@pytest.fixture(scope="module")
def report(spark: object, workload: Workload, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[Path]:
    # Spark first: the workload is made on a thread meanwhile (conftest's head_start)
    import backlog_report

    out = tmp_path_factory.mktemp("backlog")
    args = Namespace(input=str(workload.export_dir), out=str(out), master=None,
                     retention_warn_fraction=0.1, hot_factor=1.5)
    backlog_report.run(spark, args)
    yield out


def test_queue_backlog(report: Path, workload: Workload) -> None:
    q = by(table_rows(report, "queue_backlog"), "queue_name")
    assert {n: (r["visible"], r["in_flight"], r["delayed"], r["total"]) for n, r in q.items()} == {
        "jobs": (7, 1, 2, 10), "dlq": (3, 1, 0, 4), "orders": (0, 0, 0, 0),
        "billing": (0, 0, 0, 0)}
    assert q["dlq"]["is_dead_letter_queue"] and not q["jobs"]["is_dead_letter_queue"]
    # ages against the snapshot's own clock, recomputed from the exported rows
    snap = workload.snapshots[1]
    jobs = [r for r in export_rows(workload.export_dir, "messages", snap)
            if r["queue_name"] == "jobs"]
    ages = sorted((r["as_of_ms"] - r["sent_ms"]) / 1000 for r in jobs)
    assert q["jobs"]["oldest_age_s"] == pytest.approx(ages[-1])
    assert q["jobs"]["age_p50_s"] in ages and ages[0] <= q["jobs"]["age_p50_s"] <= ages[-1]
    assert q["jobs"]["near_retention"] == sum(a >= 0.9 * 345600 for a in ages) == 0
    assert q["orders"]["oldest_age_s"] is None
    overall = table_rows(report, "overall_backlog")[0]
    assert (overall["queues"], overall["total"], overall["visible"]) == (4, 14, 10)
    assert (overall["in_flight"], overall["delayed"]) == (2, 2)


def test_receive_counts_and_load(report: Path) -> None:
    hist = {(r["queue_name"], r["receive_count"]): r["messages"]
            for r in table_rows(report, "receive_counts")}
    assert hist == {("jobs", 0): 9, ("jobs", 1): 1, ("dlq", 1): 3, ("dlq", 2): 1}
    (shard,) = table_rows(report, "shard_load")
    assert (shard["shard"], shard["messages"], shard["share"], shard["hot"]) == (0, 14, 1.0, False)
    parts = by(table_rows(report, "partition_load"), "queue_name")
    assert parts["jobs"]["partition"] == 0 and parts["jobs"]["share_of_queue"] == 1.0


def test_growth_across_snapshots(report: Path, workload: Workload) -> None:
    trend = {(r["snapshot_ms"], r["queue_name"]): r["total"]
             for r in table_rows(report, "backlog_trend")}
    first, last = workload.snapshots
    assert trend[(first, "jobs")] == 7 and trend[(last, "jobs")] == 10
    g = by(table_rows(report, "growth"), "queue_name")
    window_s = (last - first) / 1000
    jobs = g["jobs"]
    assert (jobs["snapshots"], jobs["first_total"], jobs["last_total"]) == (2, 7, 10)
    assert (jobs["arrivals"], jobs["departures"]) == (4, 1)
    assert jobs["growth_per_s"] == pytest.approx(3 / window_s)
    assert jobs["arrival_rate_per_s"] == pytest.approx(4 / window_s)
    assert jobs["status"] == "growing" and jobs["time_to_drain_s"] is None
    orders = g["orders"]
    assert (orders["first_total"], orders["last_total"], orders["departures"]) == (1, 0, 1)
    assert orders["status"] == "empty" and orders["time_to_drain_s"] == 0
    assert g["dlq"]["status"] == "steady" and g["dlq"]["growth_per_s"] == 0


def test_charts_csv_and_summary(report: Path) -> None:
    for chart in ("backlog_age", "receive_counts", "shard_balance", "backlog_trend"):
        assert is_png(report / "charts" / f"{chart}.png")
        if chart != "shard_balance":  # one shard: the summary says so instead
            assert f"(charts/{chart}.png)" in (report / "summary.md").read_text()
    assert "One shard: nothing to balance" in (report / "summary.md").read_text()
    csv = (report / "csv" / "queue_backlog.csv").read_text().splitlines()
    assert csv[0].startswith("queue_name,") and len(csv) == 5
    assert "**4 queues, 14 messages**" in (report / "summary.md").read_text()


def test_hot_shard_detection(spark: object) -> None:
    from backlog_report import shard_load

    shards = spark.createDataFrame([(0,), (1,), (2,)], "shard int")  # type: ignore[attr-defined]
    rows = [(0, i, 10) for i in range(8)] + [(1, 100, 10), (1, 101, 10)]
    cur = spark.createDataFrame(  # type: ignore[attr-defined]
        [(s, seq, b, "q") for s, seq, b in rows], "shard int, seq long, size_bytes long, "
        "queue_name string")
    load = {r["shard"]: r for r in shard_load(shards, cur, 1.5).collect()}
    assert [load[s]["messages"] for s in (0, 1, 2)] == [8, 2, 0]
    assert [load[s]["hot"] for s in (0, 1, 2)] == [True, False, False]
    assert load[0]["share"] == pytest.approx(0.8) and load[2]["fair_share"] == pytest.approx(1 / 3)
