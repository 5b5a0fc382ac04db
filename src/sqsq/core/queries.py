"""Read-only questions about a shard: not commands, never logged, never write."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sqsq.core import keys, limits, regions
from sqsq.core.attributes import SETTABLE_ATTRIBUTE_NAMES, render_queue_attributes
from sqsq.core.delivery import fifo_delay_cutoff
from sqsq.core.keys import TIMER_DELAYED
from sqsq.core.queues import queue_does_not_exist
from sqsq.core.records import Counters, QueueRecord
from sqsq.core.state import ShardState
from sqsq.errors import ErrorCode, Rejection, reject

COMPUTED_ATTRIBUTE_NAMES = frozenset({
    "QueueArn",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
})


def queue(st: ShardState, name: str) -> QueueRecord | Rejection:
    q = st.queue(name)
    return q if q is not None else queue_does_not_exist()


def depth(st: ShardState, q: QueueRecord, now: int) -> Counters:
    """Counts as of ``now``: materialised counters corrected for timers already due."""
    c = st.counters(q.qid)
    visible, in_flight, delayed = c.visible, c.in_flight, c.delayed
    for _, kind in st.scan_index("w", q.qid, now):
        if kind == TIMER_DELAYED:
            delayed -= 1
        else:
            in_flight -= 1
        visible += 1
    cutoff = fifo_delay_cutoff(q, now)
    if cutoff is not None:
        due = sum(1 for _ in st.scan_index("y", q.qid, cutoff))
        delayed, visible = delayed - due, visible + due
    return Counters(visible, in_flight, delayed)


def oldest_enqueued_ms(st: ShardState, q: QueueRecord) -> int | None:
    """When the queue's oldest message was enqueued (None: the queue is empty): the first key
    of its retention index, found by one seek from the index's floor."""
    for key, _ in st.scan_index("r", q.qid):
        return keys.read_u64(key, 9)  # b"r", qid, then enqueued_ms
    return None


@dataclass(frozen=True)
class QueueGauges:
    name: str  # the queue's key
    counts: Counters
    oldest_enqueued_ms: int | None


def queue_gauges(st: ShardState, now: int) -> Iterator[QueueGauges]:
    """Every queue's depths and oldest message, for metrics: per queue, its materialised
    counters (corrected for timers due, as ``depth``) and one index seek, never a scan of its
    messages, so a scrape costs the same for an empty queue and a full one."""
    for q in st.queues():
        yield QueueGauges(q.name, depth(st, q, now), oldest_enqueued_ms(st, q))


def queue_attributes(
    st: ShardState, name: str, names: list[str], now: int
) -> dict[str, str] | Rejection:
    q = st.queue(name)
    if q is None:
        return queue_does_not_exist()
    settable = render_queue_attributes(q.attributes)
    known = set(settable) | COMPUTED_ATTRIBUTE_NAMES
    for n in names:
        if n != "All" and n not in known and n not in _SETTABLE_NOT_RENDERED:
            return reject(ErrorCode.INVALID_ATTRIBUTE_NAME, f"Unknown Attribute {n}.")
    if not names:
        return {}
    everything = {
        **settable,
        "QueueArn": st.config.queue_arn(q.name),
        "CreatedTimestamp": str(q.created_ms // 1000),
        "LastModifiedTimestamp": str(q.modified_ms // 1000),
    }
    if "All" in names or any(n.startswith("ApproximateNumberOf") for n in names):
        # Only when asked: receives look up ReceiveMessageWaitTimeSeconds through here.
        counts = depth(st, q, now)
        everything["ApproximateNumberOfMessages"] = str(counts.visible)
        everything["ApproximateNumberOfMessagesNotVisible"] = str(counts.in_flight)
        everything["ApproximateNumberOfMessagesDelayed"] = str(counts.delayed)
    if "All" in names:
        return everything
    return {n: everything[n] for n in names if n in everything}


# Attributes a user may ask for that a queue reports only when set (RedrivePolicy, Policy...).
_SETTABLE_NOT_RENDERED = frozenset({
    "RedrivePolicy",
    "RedriveAllowPolicy",
    "Policy",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "SqsManagedSseEnabled",
    "FifoQueue",
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "FifoThroughputLimit",
})

# Every queue attribute name SQS knows (what ReceiveMessage's AttributeNames quietly ignores).
QUEUE_ATTRIBUTE_NAMES = COMPUTED_ATTRIBUTE_NAMES | SETTABLE_ATTRIBUTE_NAMES


def list_queues(
    st: ShardState, prefix: str = "", max_results: int | None = None, next_token: str = ""
) -> tuple[list[str], str] | Rejection:
    """Keys of the queues of one region whose names start with a prefix (``prefix`` is the
    prefix's key in that region), in name order, and the token for the next page ('' when
    done)."""
    return names_page(regions.keys_with_prefix((q.name for q in st.queues(prefix)), prefix,
                                               st.config.region), max_results, next_token)


def names_page(names: Iterable[str], max_results: int | None = None,
               next_token: str = "") -> tuple[list[str], str] | Rejection:
    """One ListQueues page of ``names`` (in name order): the names after ``next_token``, at
    most ``max_results``, and the token for the next page ('' when done)."""
    if max_results is not None and not 1 <= max_results <= limits.LIST_QUEUES_MAX_RESULTS:
        return reject(
            ErrorCode.INVALID_PARAMETER_VALUE,
            f"Value {max_results} for parameter MaxResults is invalid. Reason: MaxResults must "
            f"be an integer between 1 and {limits.LIST_QUEUES_MAX_RESULTS}.",
        )
    limit = max_results or limits.LIST_QUEUES_MAX_RESULTS
    page: list[str] = []
    for name in names:
        if next_token and name <= next_token:
            continue
        if len(page) == limit:
            return page, page[-1] if max_results else ""
        page.append(name)
    return page, ""


def dead_letter_source_queues(st: ShardState, name: str) -> list[str] | Rejection:
    q = st.queue(name)
    if q is None:
        return queue_does_not_exist()
    arn = st.config.queue_arn(name)
    return [
        s.name
        for s in st.queues()
        if s.attributes.redrive_policy and s.attributes.redrive_policy.dead_letter_target_arn == arn
    ]


def queue_tags(st: ShardState, name: str) -> dict[str, str] | Rejection:
    q = st.queue(name)
    return dict(q.tags) if q is not None else queue_does_not_exist()
