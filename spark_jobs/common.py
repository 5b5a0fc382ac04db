"""Shared plumbing for the sqsq Spark jobs: session, inputs, outputs, charts, Markdown.

Jobs read an ``sqsq export`` directory (queues / messages / delivery, partitioned by
snapshot_ms and shard) and write:

    OUT/tables/<name>.parquet           OUT/csv/<name>.csv (with a header)
    OUT/charts/*.png                    OUT/summary.md    one page embedding the charts

Only built-in Spark functions are used (no Python UDFs), so executors on a cluster need
nothing from this file; it runs on the driver. It does not import sqsq either.
"""

from __future__ import annotations

import argparse
import csv
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

DEFAULT_MASTER = "local[*]"
SHUFFLE_PARTITIONS = 4  # the tables are small: a few partitions keep local runs quick


def parse_args(
    description: str, argv: Sequence[str] | None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--input", required=True, help="an `sqsq export --out` directory")
    p.add_argument("--out", required=True, help="where tables, charts and summary.md go")
    p.add_argument("--master", default=None,
                   help=f"Spark master URL (default {DEFAULT_MASTER}, or spark-submit's)")
    if extra:
        extra(p)
    return p.parse_args(argv)


def build_session(app_name: str, master: str | None = None) -> SparkSession:
    """A session for the jobs; local mode unless a master is given or spark-submit set one."""
    builder = SparkSession.builder.appName(app_name)
    # spark-submit starts the JVM first and hands its port over: its --master then rules
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = DEFAULT_MASTER
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        # bind to loopback: no surprises from the host's network setup in local runs
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1")
        # short jobs on small data: the quick JIT tier and a plain GC start much faster
        builder = builder.config("spark.driver.extraJavaOptions",
                                 "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    spark = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


def run_main(app_name: str, job: Callable[[SparkSession, argparse.Namespace], dict[str, Any]],
             args: argparse.Namespace) -> int:
    # reuse a session that is already running (a notebook, a test) and leave it running
    active = SparkSession.getActiveSession()
    spark = active or build_session(app_name, args.master)
    try:
        result = job(spark, args)
    finally:
        if active is None:
            spark.stop()
    print(f"{app_name}: wrote {result['summary']}")
    return 0


# ---- inputs -----------------------------------------------------------------------------


def read_dataset(spark: SparkSession, input_dir: str, name: str) -> DataFrame:
    """One dataset with its partition columns (snapshot_ms, shard) rebuilt from the path."""
    path = f"{input_dir.rstrip('/')}/{name}"
    return (spark.read.option("basePath", path).parquet(path)
            .withColumn("snapshot_ms", F.col("snapshot_ms").cast("long"))
            .withColumn("shard", F.col("shard").cast("int")))


def latest(df: DataFrame) -> DataFrame:
    """Rows of the newest snapshot only."""
    newest = df.agg(F.max("snapshot_ms")).first()[0]
    return df.where(F.col("snapshot_ms") == F.lit(newest))


def queue_name_of_arn(col: str) -> Any:
    """The queue name of an SQS ARN (its last ':' field)."""
    return F.element_at(F.split(F.col(col), ":"), -1)


# ---- outputs ----------------------------------------------------------------------------


class Outputs:
    def __init__(self, out: str) -> None:
        self.root = Path(out)
        (self.root / "charts").mkdir(parents=True, exist_ok=True)
        self.tables: list[str] = []

    def table(self, name: str, df: DataFrame) -> list[Any]:
        """Collect ``df`` and write it as tables/<name>.parquet and csv/<name>.csv; its rows.

        Report tables are aggregates, small by construction, and the report (charts,
        summary.md) is written on the driver anyway: one collect replaces two more Spark jobs
        per table and gives single files instead of part-file directories.
        """
        rows = df.collect()
        schema = arrow_schema(df.schema)
        table = pa.Table.from_pylist([r.asDict() for r in rows], schema=schema)
        for sub in ("tables", "csv"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        pq.write_table(table, self.root / "tables" / f"{name}.parquet")
        with open(self.root / "csv" / f"{name}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(schema.names)
            writer.writerows([("" if v is None else v) for v in r] for r in rows)
        self.tables.append(name)
        return rows

    def chart_path(self, name: str) -> Path:
        return self.root / "charts" / f"{name}.png"

    def summary(self, text: str) -> Path:
        path = self.root / "summary.md"
        path.write_text(text)
        return path


_ARROW_TYPES = {
    T.StringType: pa.string(), T.LongType: pa.int64(), T.IntegerType: pa.int32(),
    T.DoubleType: pa.float64(), T.FloatType: pa.float32(), T.BooleanType: pa.bool_(),
    T.ShortType: pa.int16(), T.ByteType: pa.int8(),
}


def arrow_schema(schema: T.StructType) -> pa.Schema:
    """The Arrow schema of a report table (flat columns of simple types only)."""
    return pa.schema([(f.name, _ARROW_TYPES[type(f.dataType)]) for f in schema.fields])


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in tests
    import matplotlib.pyplot as plt

    return plt


def empty_chart(path: Path, title: str, note: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 2.5))
    ax.set_title(title)
    ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


# ---- Markdown ---------------------------------------------------------------------------


def fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)


def plural(n: int, noun: str) -> str:
    """``1 message``, ``2 messages``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def integer_ticks(axis: Any) -> None:
    """Counts have no fractions: whole-number ticks only."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def md_table(rows: Sequence[Any], columns: Sequence[tuple[str, str]], limit: int = 20,
             empty: str = "_none_") -> str:
    """A Markdown table of ``rows`` (Spark Rows) with (field, heading) columns."""
    if not rows:
        return f"{empty}\n"
    head = "| " + " | ".join(h for _, h in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(fmt(r[f]) for f, _ in columns) + " |" for r in rows[:limit]]
    more = [f"\n_{len(rows) - limit} more rows in the table files._"] if len(rows) > limit else []
    return "\n".join([head, rule, *body, *more]) + "\n"


def ms_to_iso(ms: int | None) -> str:
    if ms is None:
        return "–"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
