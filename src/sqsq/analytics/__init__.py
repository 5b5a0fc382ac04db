"""Snapshot export for analytics: shard checkpoints as Parquet datasets (see docs/analytics.md).

The Spark jobs in ``spark_jobs/`` read what this writes; they do not import sqsq.
"""
