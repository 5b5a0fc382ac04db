"""`make report` right after a first `make run` and a few sends: one snapshot, one shard, a
dead-letter queue nothing was dead-lettered to yet. Both reports must come out and say so."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest

from analytics.support import HeadStart, table_rows


@pytest.fixture(scope="module")
def first_export(head_start: HeadStart) -> Path:
    """`make run`, a dead-letter queue and a queue redriving to it (maxReceiveCount 3), one
    message sent, one export (conftest's make_first_export, begun by head_start)."""
    return head_start.result("first_export")


def test_first_report_with_one_snapshot(first_export: Path, spark: object,
                                        tmp_path: Path) -> None:
    import backlog_report
    import dlq_analytics

    backlog_report.run(spark, Namespace(input=str(first_export), out=str(tmp_path / "backlog"),
                                        master=None, retention_warn_fraction=0.1,
                                        hot_factor=1.5))
    summary = (tmp_path / "backlog" / "summary.md").read_text()
    assert "1 snapshot(s)" in summary and "One snapshot: no trend yet" in summary
    assert "2 queues, 1 message**" in summary  # not "1 messages"
    assert "One shard: nothing to balance" in summary and "shard_balance.png" not in summary
    (growth,) = [r for r in table_rows(tmp_path / "backlog", "growth")
                 if r["queue_name"] == "work"]
    assert growth["status"] == "single snapshot" and growth["arrival_rate_per_s"] is None

    dlq_analytics.run(spark, Namespace(input=str(first_export), out=str(tmp_path / "dlq"),
                                       master=None, top=5, min_retention_left_s=300))
    summary = (tmp_path / "dlq" / "summary.md").read_text()
    assert "1 dead-letter queue, 0 messages**, 0 redrive candidates" in summary
    (dlq,) = table_rows(tmp_path / "dlq", "dlq_overview")
    assert dlq["sources"] == "work"  # configured to redrive here, nothing dead-lettered yet
    dominates = summary.split("## What dominates")[1].split("##")[0]
    assert "_none_" not in dominates and "No dead-lettered messages" in dominates
