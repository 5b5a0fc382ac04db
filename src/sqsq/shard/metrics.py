"""What a process's shard replicas tell Prometheus, and whether they are ready.

Two kinds of figures. Those that happen (an fsync, a group commit) are observed as they
happen, into histograms, through hooks the replica and the engine call (a hook is one
attribute set here; unset, they cost a None check). Those that are (term, indexes, leadership,
queue depths) are read when Prometheus scrapes, by a collector over the replicas this process
hosts, so nothing is kept up to date between scrapes.

Per-queue figures come from a replica only while it leads: every replica holds the same
queues, and a sum over a cluster's nodes must count each partition once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sqsq.core import queries
from sqsq.shard.engine import ShardEngine

FSYNC_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # proposer.MAX_GROUP is the last
# A replica this many applied entries short of what its leader committed is catching up,
# not ready (a replica under load is always a few behind).
READY_LAG_ENTRIES = 1000


class ShardMetrics:
    """The metrics of the shard replicas one process hosts (``engines``: shard id -> its
    engine; a cluster node adds to it as shards are given to it, calling ``attach``)."""

    def __init__(self, registry: CollectorRegistry, engines: Mapping[int, ShardEngine]) -> None:
        self.engines = engines
        self.fsync = Histogram(
            "sqsq_raft_fsync_duration_seconds",
            "Time to make a replica's Raft log and hard state durable, per Ready (fdatasync).",
            ["shard"], buckets=FSYNC_BUCKETS_S, registry=registry)
        self.group = Histogram(
            "sqsq_raft_group_commit_commands",
            "Commands per log entry the leader proposes (group commit).",
            ["shard"], buckets=GROUP_BUCKETS, registry=registry)
        registry.register(_ReplicaCollector(engines))
        for shard_id, engine in engines.items():
            self.attach(shard_id, engine)

    def attach(self, shard_id: int, engine: ShardEngine) -> None:
        """Observe ``engine``'s fsyncs and group commits (call once per replica opened)."""
        label = str(shard_id)
        engine.replica.on_sync = self.fsync.labels(shard=label).observe
        engine.proposer.on_group_commit = self.group.labels(shard=label).observe


class _ReplicaCollector(Collector):
    def __init__(self, engines: Mapping[int, ShardEngine]) -> None:
        self.engines = engines

    def collect(self) -> Iterator[Metric]:
        shard = ["shard"]
        term = GaugeMetricFamily("sqsq_raft_term", "The replica's current Raft term.",
                                 labels=shard)
        commit = GaugeMetricFamily("sqsq_raft_commit_index",
                                   "The highest log index the replica knows is committed.",
                                   labels=shard)
        applied = GaugeMetricFamily("sqsq_raft_applied_index",
                                    "The highest log index applied to the replica's state.",
                                    labels=shard)
        leader = GaugeMetricFamily("sqsq_raft_leader", "1 if the replica leads its shard.",
                                   labels=shard)
        known = GaugeMetricFamily(
            "sqsq_raft_leader_known",
            "1 if the replica leads or has heard from its leader within an election timeout.",
            labels=shard)
        snaps = CounterMetricFamily("sqsq_raft_snapshots",
                                    "Snapshots the replica wrote since it started.",
                                    labels=shard)
        by_way = CounterMetricFamily(
            "sqsq_raft_entries_applied",
            "Log entries the replica applied since it started, by how: running their "
            "commands, or writing the leader's write set.", labels=["shard", "by"])
        snap_size = GaugeMetricFamily("sqsq_raft_snapshot_size_bytes",
                                      "Size of the replica's last snapshot.", labels=shard)
        parked = GaugeMetricFamily("sqsq_long_polls_parked",
                                   "Receives waiting for a message on the replica.",
                                   labels=shard)
        messages = GaugeMetricFamily(
            "sqsq_queue_messages",
            "Messages in a queue's partition by state (visible, in_flight, delayed); "
            "from the shard's leader only.", labels=["queue", "shard", "state"])
        oldest = GaugeMetricFamily(
            "sqsq_queue_oldest_message_age_seconds",
            "Age of the oldest message in a queue's partition (0 when empty); from the "
            "shard's leader only.", labels=["queue", "shard"])
        for shard_id, engine in sorted(self.engines.items()):
            r = engine.replica
            s = [str(shard_id)]
            leads = r.is_leader()
            term.add_metric(s, r.raftCurrentTerm)
            commit.add_metric(s, r.raftCommitIndex)
            applied.add_metric(s, r.raftLastApplied)
            leader.add_metric(s, 1 if leads else 0)
            known.add_metric(s, 1 if r.leader_in_touch() is not None else 0)
            snaps.add_metric(s, r.snapshots_written)
            by_way.add_metric([s[0], "commands"], r.write_sets.applied_self)
            by_way.add_metric([s[0], "write_set"], r.write_sets.used)
            snap_size.add_metric(s, r.snapshot_bytes)
            parked.add_metric(s, engine.waiters.parked)
            if leads:
                now, rows = engine.query(lambda st, now: (now, list(
                    queries.queue_gauges(st, now))))
                for g in rows:
                    c = g.counts
                    for state, n in (("visible", c.visible), ("in_flight", c.in_flight),
                                     ("delayed", c.delayed)):
                        messages.add_metric([g.name, s[0], state], n)
                    age_ms = 0 if g.oldest_enqueued_ms is None else now - g.oldest_enqueued_ms
                    oldest.add_metric([g.name, s[0]], max(age_ms, 0) / 1000)
        yield from (term, commit, applied, leader, known, snaps, by_way, snap_size, parked,
                    messages, oldest)


def replica_problems(shard_id: int, engine: ShardEngine) -> list[str]:
    """Why a replica is not ready, if it is not: stopped, still catching up, or without a
    leader it is in touch with."""
    r = engine.replica
    if r.fatal is not None:
        return [f"shard {shard_id}: the replica has stopped: {r.fatal!r}"]
    problems = []
    if r.learner:
        problems.append(f"shard {shard_id}: a new member catching up (not voting yet)")
    if r.leader_in_touch() is None:
        problems.append(f"shard {shard_id}: no leader (none known, or not heard from within "
                        "an election timeout)")
    behind = r.behind()
    if behind > READY_LAG_ENTRIES:
        problems.append(f"shard {shard_id}: {behind} committed entries not applied yet")
    return problems
