"""The dead-letter job through its command-line entry point, checked against the workload
(see conftest)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from analytics.support import Workload, by, is_png, table_rows


@pytest.fixture(scope="module")
def report(spark: object, workload: Workload, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[Path]:
    # Spark first: the workload is made on a thread meanwhile (conftest's head_start)
    import dlq_analytics

    # main() parses the same arguments as `python spark_jobs/dlq_analytics.py`; it reuses the
    # shared session (and leaves it running) instead of starting a second JVM
    out = tmp_path_factory.mktemp("dlq")
    assert dlq_analytics.main(["--input", str(workload.export_dir), "--out", str(out)]) == 0
    assert not spark.sparkContext._jsc.sc().isStopped()  # type: ignore[attr-defined]
    yield out


def test_overview_and_sources(report: Path) -> None:
    (dlq,) = table_rows(report, "dlq_overview")
    assert (dlq["dlq_name"], dlq["messages"], dlq["visible"], dlq["in_flight"]) == (
        "dlq", 4, 3, 1)
    assert (dlq["source_queues"], dlq["sources"]) == (2, "billing,orders")
    src = by(table_rows(report, "dlq_by_source"), "source_queue")
    assert {s: r["messages"] for s, r in src.items()} == {"orders": 3, "billing": 1}
    assert (src["orders"]["receive_count_min"], src["orders"]["receive_count_max"]) == (1, 2)
    assert src["billing"]["receive_count_max"] == 1 and src["billing"]["source_exists"]
    assert all(r["send_to_dlq_p50_s"] >= 0 for r in src.values())
    hist = {r["receive_count"]: r["messages"] for r in table_rows(report, "dlq_receive_counts")}
    assert hist == {1: 3, 2: 1}


def test_dominant_groups_and_attributes(report: Path) -> None:
    top_group = table_rows(report, "dlq_top_groups")[0]
    assert (top_group["group_id"], top_group["messages"], top_group["share"]) == (
        "tenant-a", 2, 0.5)
    attrs = by(table_rows(report, "dlq_top_attributes"), "attribute", "value")
    assert attrs[("kind", "bad")]["messages"] == 3 and attrs[("kind", "bad")]["rank"] == 1
    assert attrs[("kind", "bad")]["share"] == 0.75
    assert attrs[("kind", "timeout")]["messages"] == 1


def test_redrive_candidates(report: Path, workload: Workload) -> None:
    candidates = table_rows(report, "redrive_candidates")
    assert sorted(r["source_queue"] for r in candidates) == ["billing", "orders", "orders"]
    assert workload.dlq_in_flight_id not in {r["message_id"] for r in candidates}
    assert all(r["retention_left_s"] > 345000 for r in candidates)


def test_charts_and_summary(report: Path) -> None:
    summary = (report / "summary.md").read_text()
    for chart in ("dlq_sources", "dlq_receive_counts"):
        assert is_png(report / "charts" / f"{chart}.png")
        assert f"(charts/{chart}.png)" in summary
    assert "**1 dead-letter queue, 4 messages**, 3 redrive candidates" in summary
