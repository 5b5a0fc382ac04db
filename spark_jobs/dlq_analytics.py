"""Dead-letter analytics over the newest ``sqsq export`` snapshot: what fails, from where, why.

    python spark_jobs/dlq_analytics.py --input ./snapshots --out ./reports/dlq
    spark-submit --master spark://host:7077 --py-files spark_jobs/common.py \\
        spark_jobs/dlq_analytics.py --input /shared/snapshots --out /shared/reports/dlq

A dead-letter queue is any queue named by another queue's redrive policy, or holding messages
that carry a dead-letter source. Tables (tables/<name>.parquet and csv/<name>.csv):
  dlq_overview        per DLQ: messages, visible / in flight, source queues, oldest
  dlq_by_source       per DLQ and source queue: messages, receive counts, send-to-DLQ time
  dlq_receive_counts  per DLQ and receive count: messages
  dlq_top_groups      per DLQ: the message groups holding most messages (top --top)
  dlq_top_attributes  per DLQ: the message attribute values that dominate (top --top)
  redrive_candidates  messages worth moving back: the source queue still exists, the message
                      is not being worked on in the DLQ, and retention leaves time to process
Charts: dlq_sources.png, dlq_receive_counts.png.
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
    p.add_argument("--top", type=int, default=10, help="rows per DLQ in the top-N tables (10)")
    p.add_argument("--min-retention-left-s", type=int, default=300,
                   help="redrive only messages with at least this much retention left (300)")


def load(spark: SparkSession, input_dir: str) -> tuple[int, DataFrame, DataFrame]:
    """(newest snapshot, its queues, its dead-letter messages joined with their delivery)."""
    queues = common.latest(common.read_dataset(spark, input_dir, "queues"))
    newest = queues.agg(F.max("snapshot_ms")).first()[0]
    if newest is None:
        raise SystemExit(f"{input_dir}: no snapshots (run `sqsq export --out` first)")
    queues = queues.groupBy("queue_name").agg(
        F.first("queue_arn").alias("queue_arn"),
        F.max("is_dead_letter_queue").alias("is_dead_letter_queue"),
        F.first("message_retention_period_s").alias("message_retention_period_s"),
        F.first("dead_letter_target_arn").alias("dead_letter_target_arn"))
    messages = common.read_dataset(spark, input_dir, "messages").where(
        F.col("snapshot_ms") == newest)
    delivery = common.read_dataset(spark, input_dir, "delivery").where(
        F.col("snapshot_ms") == newest).select(*KEYS, "state", "receive_count")
    dlq_names = queues.where("is_dead_letter_queue").select("queue_name").union(
        messages.where(F.col("dead_letter_source_arn").isNotNull()).select("queue_name")
    ).distinct()
    source_names = queues.select(F.col("queue_name").alias("source_queue"),
                                 F.lit(True).alias("source_exists"))
    dead = (messages.join(dlq_names, "queue_name")
            .join(delivery, KEYS)
            .join(queues.select("queue_name", "message_retention_period_s"), "queue_name")
            .withColumnRenamed("queue_name", "dlq_name")
            .withColumn("source_queue", common.queue_name_of_arn("dead_letter_source_arn"))
            .join(source_names, "source_queue", "left")
            .fillna(False, ["source_exists"])
            .withColumn("send_to_dlq_s",
                        (F.col("dead_lettered_ms") - F.col("sent_ms")) / 1000.0)
            .withColumn("age_s", (F.col("as_of_ms") - F.col("sent_ms")) / 1000.0)
            # SQS keeps a dead-lettered message until its original send time plus retention
            .withColumn("retention_left_s",
                        F.col("message_retention_period_s") - F.col("age_s")))
    # Source queues as configured (their redrive policy names the DLQ), messages or not.
    configured = (queues.where(F.col("dead_letter_target_arn").isNotNull())
                  .withColumn("dlq", common.queue_name_of_arn("dead_letter_target_arn"))
                  .groupBy(F.col("dlq").alias("queue_name"))
                  .agg(F.collect_set("queue_name").alias("configured_sources")))
    dlqs = (queues.drop("dead_letter_target_arn").join(dlq_names, "queue_name")
            .join(configured, "queue_name", "left"))
    return newest, dlqs, dead


def _top(df: DataFrame, key: list[str], n: int) -> DataFrame:
    """Rows of ``df`` (with a ``messages`` column) ranked within each DLQ, top ``n``, with
    their share of the DLQ."""
    totals = df.groupBy("dlq_name").agg(F.sum("messages").alias("dlq_messages"))
    w = Window.partitionBy("dlq_name").orderBy(F.desc("messages"), *key)
    return (df.join(totals, "dlq_name").withColumn("share", F.col("messages") / F.col(
        "dlq_messages")).withColumn("rank", F.row_number().over(w)).where(F.col("rank") <= n)
            .drop("dlq_messages").orderBy("dlq_name", "rank"))


def run(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    out = common.Outputs(args.out)
    newest, dlqs, dead = load(spark, args.input)
    dead = dead.cache()
    t: dict[str, list[Any]] = {}
    pct = F.percentile_approx("send_to_dlq_s", [0.5, 0.9], 10000)
    overview = dlqs.select(F.col("queue_name").alias("dlq_name"), "configured_sources").join(
        dead.groupBy("dlq_name").agg(
            F.count("*").alias("messages"),
            F.sum(F.when(F.col("state") == "VISIBLE", 1).otherwise(0)).alias("visible"),
            F.sum(F.when(F.col("state") == "IN_FLIGHT", 1).otherwise(0)).alias("in_flight"),
            F.countDistinct("source_queue").alias("source_queues"),
            F.collect_set("source_queue").alias("seen_sources"),
            F.max("age_s").alias("oldest_age_s"),
            F.max("dead_lettered_ms").alias("last_dead_lettered_ms")),
        "dlq_name", "left").fillna(0, ["messages", "visible", "in_flight", "source_queues"])
    empty = F.array().cast("array<string>")
    overview = overview.withColumn("sources", F.concat_ws(",", F.array_sort(F.array_distinct(
        F.concat(F.coalesce("configured_sources", empty), F.coalesce("seen_sources", empty))))))
    overview = overview.drop("configured_sources", "seen_sources")
    t["dlq_overview"] = out.table("dlq_overview", overview.orderBy(F.desc("messages"),
                                                                   "dlq_name"))
    t["dlq_by_source"] = out.table("dlq_by_source", dead.groupBy("dlq_name", "source_queue").agg(
        F.count("*").alias("messages"), F.first("source_exists").alias("source_exists"),
        F.min("receive_count").alias("receive_count_min"),
        F.avg("receive_count").alias("receive_count_avg"),
        F.max("receive_count").alias("receive_count_max"),
        pct.getItem(0).alias("send_to_dlq_p50_s"), pct.getItem(1).alias("send_to_dlq_p90_s"),
        F.max("send_to_dlq_s").alias("send_to_dlq_max_s"),
        F.min("dead_lettered_ms").alias("first_dead_lettered_ms"),
        F.max("dead_lettered_ms").alias("last_dead_lettered_ms"),
    ).orderBy("dlq_name", F.desc("messages"), "source_queue"))
    t["dlq_receive_counts"] = out.table("dlq_receive_counts", dead.groupBy(
        "dlq_name", "receive_count").agg(F.count("*").alias("messages"))
        .orderBy("dlq_name", "receive_count"))
    groups = dead.withColumn("group_id", F.coalesce("group_id", F.lit("(none)"))).groupBy(
        "dlq_name", "group_id").agg(F.count("*").alias("messages"))
    t["dlq_top_groups"] = out.table("dlq_top_groups", _top(groups, ["group_id"], args.top))
    attrs = (dead.select("dlq_name", F.explode("attributes").alias("attribute", "value"))
             .groupBy("dlq_name", "attribute", "value").agg(F.count("*").alias("messages")))
    t["dlq_top_attributes"] = out.table("dlq_top_attributes",
                                        _top(attrs, ["attribute", "value"], args.top))
    candidates = dead.where(
        F.col("source_exists") & (F.col("state") != "IN_FLIGHT")
        & (F.col("retention_left_s") >= args.min_retention_left_s)
    ).select("dlq_name", "source_queue", "message_id", "group_id", "receive_count", "sent_ms",
             "dead_lettered_ms", "send_to_dlq_s", "retention_left_s", "state", "shard")
    t["redrive_candidates"] = out.table(
        "redrive_candidates", candidates.orderBy("dlq_name", "source_queue", "sent_ms"))
    dead.unpersist()
    charts(out, t)
    summary = out.summary(render_summary(args, newest, t))
    return {"summary": summary, "tables": t, "snapshot_ms": newest}


def charts(out: common.Outputs, t: dict[str, list[Any]]) -> None:
    plt = common.pyplot()
    by_source = t["dlq_by_source"]
    if by_source:
        dlqs = sorted({r["dlq_name"] for r in by_source})
        fig, ax = plt.subplots(figsize=(8, 1.5 + 0.5 * len(dlqs)))
        left = [0] * len(dlqs)
        for source in sorted({r["source_queue"] or "(unknown)" for r in by_source}):
            values = [sum(r["messages"] for r in by_source if r["dlq_name"] == d
                          and (r["source_queue"] or "(unknown)") == source) for d in dlqs]
            ax.barh(dlqs, values, left=left, label=source)
            left = [a + b for a, b in zip(left, values, strict=True)]
        ax.set_xlabel("dead-lettered messages")
        ax.set_title("Dead-letter queues by source queue")
        ax.legend(fontsize="small")
        fig.savefig(out.chart_path("dlq_sources"), dpi=100, bbox_inches="tight")
        plt.close(fig)
    else:
        common.empty_chart(out.chart_path("dlq_sources"), "Dead-letter queues by source",
                           "no dead-lettered messages")
    hist = t["dlq_receive_counts"]
    if hist:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        counts = sorted({r["receive_count"] for r in hist})
        bottom = [0] * len(counts)
        for d in sorted({r["dlq_name"] for r in hist}):
            values = [sum(r["messages"] for r in hist if r["dlq_name"] == d
                          and r["receive_count"] == c) for c in counts]
            ax.bar([str(c) for c in counts], values, bottom=bottom, label=d)
            bottom = [a + b for a, b in zip(bottom, values, strict=True)]
        ax.set_xlabel("receive count when dead-lettered")
        ax.set_ylabel("messages")
        ax.set_title("Dead-lettered messages by receive count")
        ax.legend(fontsize="small")
        fig.savefig(out.chart_path("dlq_receive_counts"), dpi=100, bbox_inches="tight")
        plt.close(fig)
    else:
        common.empty_chart(out.chart_path("dlq_receive_counts"), "Receive counts",
                           "no dead-lettered messages")


def _dominates(t: dict[str, list[Any]]) -> list[str]:
    """The "What dominates" tables, or one line saying why there is nothing to show."""
    if not t["dlq_top_groups"]:
        return ["_No dead-lettered messages._", ""]
    out = [common.md_table(t["dlq_top_groups"], [
        ("dlq_name", "DLQ"), ("rank", "#"), ("group_id", "message group"),
        ("messages", "messages"), ("share", "share")])]
    out.append(common.md_table(t["dlq_top_attributes"], [
        ("dlq_name", "DLQ"), ("rank", "#"), ("attribute", "attribute"), ("value", "value"),
        ("messages", "messages"), ("share", "share")],
        empty="_No message attributes on the dead-lettered messages._"))
    return out


def render_summary(args: argparse.Namespace, newest: int, t: dict[str, list[Any]]) -> str:
    total = sum(r["messages"] for r in t["dlq_overview"])
    return "\n".join([
        "# sqsq dead-letter report",
        "",
        f"Input `{args.input}`, snapshot {common.ms_to_iso(newest)} (`snapshot_ms={newest}`): "
        f"**{common.plural(len(t['dlq_overview']), 'dead-letter queue')}, "
        f"{common.plural(total, 'message')}**, "
        f"{common.plural(len(t['redrive_candidates']), 'redrive candidate')}.",
        "",
        common.md_table(t["dlq_overview"], [
            ("dlq_name", "DLQ"), ("messages", "messages"), ("visible", "visible"),
            ("in_flight", "in flight"), ("sources", "source queues"),
            ("oldest_age_s", "oldest s")]),
        "## By source queue",
        "",
        common.md_table(t["dlq_by_source"], [
            ("dlq_name", "DLQ"), ("source_queue", "source"), ("messages", "messages"),
            ("receive_count_avg", "avg receives"), ("send_to_dlq_p50_s", "p50 send→DLQ s"),
            ("send_to_dlq_p90_s", "p90 send→DLQ s"), ("source_exists", "source exists")]),
        "![sources](charts/dlq_sources.png) ![receive counts](charts/dlq_receive_counts.png)",
        "",
        "## What dominates",
        "",
        *_dominates(t),
        "## Redrive candidates",
        "",
        common.md_table(t["redrive_candidates"], [
            ("dlq_name", "DLQ"), ("source_queue", "back to"), ("message_id", "message"),
            ("receive_count", "receives"), ("retention_left_s", "retention left s")], limit=10),
        "Tables: `tables/<name>.parquet` and `csv/<name>.csv`: "
        + ", ".join(f"`{n}`" for n in t) + ".",
        "",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    args = common.parse_args("sqsq dead-letter analytics", argv, _options)
    return common.run_main("sqsq-dlq-analytics", run, args)


if __name__ == "__main__":
    sys.exit(main())
