"""Backlog report over ``sqsq export`` snapshots: how much waits, how old it is, where it sits.

    python spark_jobs/backlog_report.py --input ./snapshots --out ./reports/backlog
    spark-submit --master spark://host:7077 --py-files spark_jobs/common.py \\
        spark_jobs/backlog_report.py --input /shared/snapshots --out /shared/reports/backlog

Tables (tables/<name>.parquet and csv/<name>.csv), all as of the newest snapshot unless noted:
  queue_backlog        per queue: visible / in-flight / delayed, oldest age, age percentiles,
                       messages near their retention limit, bytes
  overall_backlog      the same over every queue (one row)
  receive_counts       per queue and receive count: messages
  shard_load           per shard: messages, share, hot flag (share >= --hot-factor x fair share)
  partition_load       per queue partition (the queue on one shard), idle ones too: messages,
                       bytes, its share of the queue and how many partitions the queue has
  backlog_trend        every snapshot: per queue counts (input of the growth table)
  growth               per queue across snapshots: growth rate (least squares), arrivals and
                       departures between the first and last snapshot, time to drain
Charts: backlog_age.png, receive_counts.png, shard_balance.png, backlog_trend.png.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import common
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

KEYS = ["snapshot_ms", "shard", "qid", "seq"]


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--retention-warn-fraction", type=float, default=0.1,
                   help="near retention: less than this fraction of the period left (0.1)")
    p.add_argument("--hot-factor", type=float, default=1.5,
                   help="a shard is hot when its share is >= this times the fair share (1.5)")


def _count(state: str) -> Any:
    return F.sum(F.when(F.col("state") == state, 1).otherwise(0)).cast("long")


def _backlog_aggs(warn_fraction: float) -> list[Any]:
    pct = F.percentile_approx("age_s", [0.5, 0.9, 0.99], 10000)
    near = F.col("age_s") >= (1.0 - warn_fraction) * F.col("message_retention_period_s")
    return [
        _count("VISIBLE").alias("visible"), _count("IN_FLIGHT").alias("in_flight"),
        _count("DELAYED").alias("delayed"), F.count("seq").alias("total"),
        F.max("age_s").alias("oldest_age_s"), pct.getItem(0).alias("age_p50_s"),
        pct.getItem(1).alias("age_p90_s"), pct.getItem(2).alias("age_p99_s"),
        F.sum(F.when(near, 1).otherwise(0)).cast("long").alias("near_retention"),
        F.sum("size_bytes").cast("long").alias("bytes"),
        F.avg("receive_count").alias("mean_receive_count"),
    ]


def load(spark: SparkSession, input_dir: str) -> tuple[DataFrame, DataFrame, list[str]]:
    """(queue attributes per snapshot, one row per message per snapshot with its age, the
    queues dataset's files)."""
    queues = common.read_dataset(spark, input_dir, "queues")
    queue_attrs = queues.groupBy("snapshot_ms", "queue_name").agg(
        F.first("fifo").alias("fifo"), F.max("is_dead_letter_queue").alias("is_dead_letter_queue"),
        F.first("message_retention_period_s").alias("message_retention_period_s"),
    )
    delivery = common.read_dataset(spark, input_dir, "delivery").select(
        *KEYS, "as_of_ms", "partition", "queue_name", "message_id", "state", "receive_count")
    messages = common.read_dataset(spark, input_dir, "messages").select(
        *KEYS, "sent_ms", "size_bytes")
    rows = (delivery.join(messages, KEYS)
            .withColumn("age_s", (F.col("as_of_ms") - F.col("sent_ms")) / 1000.0)
            .join(queue_attrs.select("snapshot_ms", "queue_name", "message_retention_period_s"),
                  ["snapshot_ms", "queue_name"], "left"))
    return queue_attrs, rows, queues.inputFiles()


def growth_tables(queue_attrs: DataFrame, rows: DataFrame) -> tuple[DataFrame, DataFrame]:
    counts = rows.groupBy("snapshot_ms", "queue_name").agg(
        F.count("seq").alias("total"), _count("VISIBLE").alias("visible"),
        _count("IN_FLIGHT").alias("in_flight"), _count("DELAYED").alias("delayed"))
    # every queue that existed in a snapshot gets a row, empty ones with zeros
    trend = (queue_attrs.select("snapshot_ms", "queue_name")
             .join(counts, ["snapshot_ms", "queue_name"], "left")
             .fillna(0, ["total", "visible", "in_flight", "delayed"]))
    first_ms, last_ms = trend.agg(F.min("snapshot_ms"), F.max("snapshot_ms")).first()
    ids = rows.select("snapshot_ms", "queue_name", "message_id")
    first_ids = ids.where(F.col("snapshot_ms") == first_ms).drop("snapshot_ms")
    last_ids = ids.where(F.col("snapshot_ms") == last_ms).drop("snapshot_ms")
    # a message moved to a dead-letter queue departs its source and arrives in the DLQ
    arrivals = last_ids.join(first_ids, ["queue_name", "message_id"], "left_anti").groupBy(
        "queue_name").agg(F.count("*").alias("arrivals"))
    departures = first_ids.join(last_ids, ["queue_name", "message_id"], "left_anti").groupBy(
        "queue_name").agg(F.count("*").alias("departures"))
    window_s = (last_ms - first_ms) / 1000.0
    # One snapshot: no window, no rates (a typed null: an untyped one has no Parquet type).
    per_s = ((lambda c: F.col(c) / F.lit(window_s)) if window_s > 0
             else (lambda c: F.lit(None).cast("double")))
    slope = F.col("growth_per_s")
    growth = (
        trend.groupBy("queue_name").agg(
            F.count("*").alias("snapshots"),
            F.min("snapshot_ms").alias("first_snapshot_ms"),
            F.max("snapshot_ms").alias("last_snapshot_ms"),
            F.min_by("total", "snapshot_ms").alias("first_total"),
            F.max_by("total", "snapshot_ms").alias("last_total"),
            # Seconds since the first snapshot: epoch milliseconds squared lose precision.
            F.regr_slope(F.col("total").cast("double"),
                         (F.col("snapshot_ms") - F.lit(first_ms)) / 1000.0).alias("growth_per_s"))
        .join(arrivals, "queue_name", "left").join(departures, "queue_name", "left")
        .fillna(0, ["arrivals", "departures"])
        .withColumn("arrival_rate_per_s", per_s("arrivals"))
        .withColumn("departure_rate_per_s", per_s("departures"))
        .withColumn("time_to_drain_s", F.when(F.col("last_total") == 0, F.lit(0.0))
                    .when(slope < 0, F.col("last_total") / -slope))
        .withColumn("status", F.when(F.col("last_total") == 0, "empty")
                    .when(F.col("snapshots") < 2, "single snapshot")
                    .when(slope < 0, "draining").when(slope > 0, "growing")
                    .otherwise("steady"))
        .orderBy("queue_name")
    )
    return trend.orderBy("snapshot_ms", "queue_name"), growth


def shard_load(queue_attrs_shards: DataFrame, cur: DataFrame, hot_factor: float) -> DataFrame:
    per_shard = cur.groupBy("shard").agg(
        F.count("seq").alias("messages"), F.sum("size_bytes").cast("long").alias("bytes"),
        F.countDistinct("queue_name").alias("queues_with_messages"))
    shards = queue_attrs_shards.join(per_shard, "shard", "left").fillna(
        0, ["messages", "bytes", "queues_with_messages"])
    totals = shards.agg(F.count("*").alias("shards"), F.sum("messages").alias("all_messages"))
    fair = 1.0 / F.col("shards")
    return (shards.crossJoin(totals)
            .withColumn("share", F.when(F.col("all_messages") > 0,
                                        F.col("messages") / F.col("all_messages")).otherwise(0.0))
            .withColumn("fair_share", fair)
            .withColumn("hot", (F.col("shards") > 1) & (F.col("share") >= fair * hot_factor))
            .drop("all_messages").orderBy("shard"))


def partition_load(held: DataFrame, cur: DataFrame) -> DataFrame:
    """Per queue partition: ``held`` has a (queue_name, shard) row for each, from the queues
    dataset (in a cluster a queue has one partition per shard it lives on, each exported by
    its shard), so a partition with no messages is there too. ``partition`` is the index the
    messages were exported with (null for an idle partition)."""
    counts = cur.groupBy("queue_name", "shard").agg(
        F.min("partition").alias("partition"), F.count("*").alias("messages"),
        F.sum("size_bytes").cast("long").alias("bytes"))
    queue = Window.partitionBy("queue_name")
    return (held.join(counts, ["queue_name", "shard"], "left").fillna(0, ["messages", "bytes"])
            .withColumn("queue_messages", F.sum("messages").over(queue))
            .withColumn("share_of_queue", F.when(F.col("queue_messages") > 0, F.col("messages")
                                                 / F.col("queue_messages")).otherwise(0.0))
            .withColumn("partitions", F.count("*").over(queue))
            .select("queue_name", "partition", "shard", "messages", "bytes", "share_of_queue",
                    "partitions")
            .orderBy("queue_name", "shard"))


def snapshot_shards(files: list[str], snapshot_ms: int) -> list[int]:
    """Every shard exported in a snapshot, idle ones too: read from the file names, since an
    idle shard's files hold no rows."""
    marker = f"snapshot_ms={snapshot_ms}/shard="
    return sorted({int(f.split(marker, 1)[1].split("/", 1)[0]) for f in files if marker in f})


def run(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    out = common.Outputs(args.out)
    queue_attrs, rows, files = load(spark, args.input)
    newest = queue_attrs.agg(F.max("snapshot_ms")).first()[0]
    if newest is None:
        raise SystemExit(f"{args.input}: no snapshots (run `sqsq export --out` first)")
    rows = rows.cache()
    cur = rows.where(F.col("snapshot_ms") == newest)
    cur_attrs = queue_attrs.where(F.col("snapshot_ms") == newest).drop("snapshot_ms")
    aggs = _backlog_aggs(args.retention_warn_fraction)
    by_queue = (cur_attrs.drop("message_retention_period_s")
                .join(cur.groupBy("queue_name").agg(*aggs), "queue_name", "left")
                .fillna(0, ["visible", "in_flight", "delayed", "total", "near_retention", "bytes"])
                .orderBy(F.desc("total"), "queue_name"))
    t: dict[str, list[Any]] = {}
    t["queue_backlog"] = out.table("queue_backlog", by_queue)
    overall = cur.agg(*aggs).crossJoin(cur_attrs.agg(F.count("*").alias("queues")))
    t["overall_backlog"] = out.table("overall_backlog", overall)
    t["receive_counts"] = out.table("receive_counts", cur.groupBy("queue_name", "receive_count")
                                    .agg(F.count("*").alias("messages"))
                                    .orderBy("queue_name", "receive_count"))
    shards = spark.createDataFrame([(s,) for s in snapshot_shards(files, newest)], "shard int")
    t["shard_load"] = out.table("shard_load", shard_load(shards, cur, args.hot_factor))
    held = (common.read_dataset(spark, args.input, "queues")
            .where(F.col("snapshot_ms") == newest).select("queue_name", "shard").distinct())
    t["partition_load"] = out.table("partition_load", partition_load(held, cur))
    trend, growth = growth_tables(queue_attrs, rows)
    t["backlog_trend"] = out.table("backlog_trend", trend)
    t["growth"] = out.table("growth", growth)
    rows.unpersist()
    charts(out, t)
    summary = out.summary(render_summary(args, newest, t))
    return {"summary": summary, "tables": t, "snapshot_ms": newest}


# ---- charts and summary ---------------------------------------------------------------------


ONE_SNAPSHOT = "one snapshot: no trend yet"


def charts(out: common.Outputs, t: dict[str, list[Any]]) -> None:
    plt = common.pyplot()
    aged = [r for r in t["queue_backlog"] if r["total"]][:15]
    if aged:
        fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * len(aged)))
        names = [r["queue_name"] for r in aged][::-1]
        for field, label, alpha in (("oldest_age_s", "oldest", 0.35), ("age_p90_s", "p90", 0.6),
                                    ("age_p50_s", "median", 1.0)):
            ax.barh(names, [r[field] or 0 for r in aged][::-1], color="tab:blue", alpha=alpha,
                    label=label)
        ax.set_xlabel("message age (s)")
        ax.set_title("Backlog age by queue")
        ax.legend(loc="lower right")
        fig.savefig(out.chart_path("backlog_age"), dpi=100, bbox_inches="tight")
        plt.close(fig)
    else:
        common.empty_chart(out.chart_path("backlog_age"), "Backlog age by queue", "no messages")
    receive_count_chart(plt, out, t["receive_counts"])
    shards = t["shard_load"]
    trend_chart(plt, out, t["backlog_trend"])
    if len(shards) < 2:
        common.empty_chart(out.chart_path("shard_balance"), "Shard balance",
                           "one shard: nothing to balance")
        return
    fig, ax = plt.subplots(figsize=(max(4, 0.8 * len(shards) + 2), 3.5))
    ax.bar([str(r["shard"]) for r in shards], [r["messages"] for r in shards],
           color=["tab:red" if r["hot"] else "tab:green" for r in shards])
    total = sum(r["messages"] for r in shards)
    if shards:
        ax.axhline(total / len(shards), color="gray", linestyle="--", label="fair share")
        ax.legend()
    ax.set_xlabel("shard")
    ax.set_ylabel("messages")
    common.integer_ticks(ax.yaxis)
    ax.set_title("Shard balance (red: hot)")
    fig.savefig(out.chart_path("shard_balance"), dpi=100, bbox_inches="tight")
    plt.close(fig)


def receive_count_chart(plt: Any, out: common.Outputs, hist: list[Any]) -> None:
    if not hist:
        common.empty_chart(out.chart_path("receive_counts"), "Receive counts", "no messages")
        return
    counts = sorted({r["receive_count"] for r in hist})
    by_queue: dict[str, dict[int, int]] = {}
    for r in hist:
        by_queue.setdefault(r["queue_name"], {})[r["receive_count"]] = r["messages"]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    bottom = [0] * len(counts)
    for name, per in sorted(by_queue.items(), key=lambda kv: -sum(kv[1].values()))[:8]:
        values = [per.get(c, 0) for c in counts]
        ax.bar([str(c) for c in counts], values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xlabel("receive count")
    ax.set_ylabel("messages")
    common.integer_ticks(ax.yaxis)
    ax.set_title("Receive counts (top queues)")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))  # off the bars
    fig.savefig(out.chart_path("receive_counts"), dpi=100, bbox_inches="tight")
    plt.close(fig)


def trend_chart(plt: Any, out: common.Outputs, trend: list[Any]) -> None:
    series: dict[str, list[tuple[int, int]]] = {}
    for r in trend:
        series.setdefault(r["queue_name"], []).append((r["snapshot_ms"], r["total"]))
    if len({r["snapshot_ms"] for r in trend}) < 2:
        common.empty_chart(out.chart_path("backlog_trend"), "Backlog over time",
                           ONE_SNAPSHOT if series else "no snapshots")
        return
    t0 = min(ms for points in series.values() for ms, _ in points)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    top = sorted(series.items(), key=lambda kv: -max(n for _, n in kv[1]))[:8]
    for name, points in top:
        ax.plot([(ms - t0) / 1000 for ms, _ in points], [n for _, n in points], marker="o",
                label=name)
    ax.set_xlabel("seconds since first snapshot")
    ax.set_ylabel("messages")
    common.integer_ticks(ax.yaxis)
    ax.set_title("Backlog over time")
    ax.legend(fontsize="small")
    fig.savefig(out.chart_path("backlog_trend"), dpi=100, bbox_inches="tight")
    plt.close(fig)


def render_summary(args: argparse.Namespace, newest: int, t: dict[str, list[Any]]) -> str:
    o = t["overall_backlog"][0]
    hot = [str(r["shard"]) for r in t["shard_load"] if r["hot"]]
    snapshots = sorted({r["snapshot_ms"] for r in t["backlog_trend"]})
    return "\n".join([
        "# sqsq backlog report",
        "",
        f"Input `{args.input}`: {len(snapshots)} snapshot(s), newest "
        f"{common.ms_to_iso(newest)} (`snapshot_ms={newest}`).",
        "",
        f"**{common.plural(o['queues'], 'queue')}, {common.plural(o['total'], 'message')}**: "
        f"{o['visible']} visible, "
        f"{o['in_flight']} in flight, {o['delayed']} delayed; oldest "
        f"{common.fmt(o['oldest_age_s'])} s, p90 age {common.fmt(o['age_p90_s'])} s; "
        f"{o['near_retention']} near their retention limit. "
        f"Hot shards: {', '.join(hot) if hot else 'none'}.",
        "",
        "## Queues",
        "",
        common.md_table(t["queue_backlog"], [
            ("queue_name", "queue"), ("visible", "visible"), ("in_flight", "in flight"),
            ("delayed", "delayed"), ("oldest_age_s", "oldest s"), ("age_p50_s", "p50 s"),
            ("age_p90_s", "p90 s"), ("near_retention", "near retention"),
            ("is_dead_letter_queue", "DLQ")]),
        "![backlog age](charts/backlog_age.png)",
        "",
        "## Growth across snapshots",
        "",
        *([f"_{ONE_SNAPSHOT.capitalize()}: export again later (`make report`) to see growth._",
           ""] if len(snapshots) < 2 else []),
        common.md_table(t["growth"], [
            ("queue_name", "queue"), ("snapshots", "snapshots"), ("last_total", "messages"),
            ("growth_per_s", "growth /s"), ("arrivals", "arrived"), ("departures", "left"),
            ("time_to_drain_s", "drain s"), ("status", "status")]),
        "![backlog trend](charts/backlog_trend.png)",
        "",
        "## Receive counts and shard balance",
        "",
        "![receive counts](charts/receive_counts.png)"
        + (" ![shard balance](charts/shard_balance.png)" if len(t["shard_load"]) > 1
           else "\n\n_One shard: nothing to balance._"),
        "",
        common.md_table(t["shard_load"], [
            ("shard", "shard"), ("messages", "messages"), ("share", "share"),
            ("fair_share", "fair share"), ("hot", "hot")]),
        *_partitions_section(t["partition_load"]),
        "Tables: `tables/<name>.parquet` and `csv/<name>.csv`: "
        + ", ".join(f"`{n}`" for n in t) + ".",
        "",
    ])


def _partitions_section(parts: list[Any]) -> list[str]:
    """Load per partition of the queues that have several (one shard each); nothing when
    every queue has one partition (its load is the queue's, shown above)."""
    spread = [r for r in parts if r["partitions"] > 1]
    if not spread:
        return []
    return ["## Partitions", "", common.md_table(spread, [
        ("queue_name", "queue"), ("shard", "shard"), ("messages", "messages"),
        ("share_of_queue", "share of queue")], limit=40)]


def main(argv: Sequence[str] | None = None) -> int:
    args = common.parse_args("sqsq backlog report", argv, _options)
    return common.run_main("sqsq-backlog-report", run, args)


if __name__ == "__main__":
    sys.exit(main())
