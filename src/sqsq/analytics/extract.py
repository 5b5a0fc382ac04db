"""Rows for the export, read from one shard's store as of one instant.

Pure reads over a ``KVReader`` (a checkpoint opened read-write, or any twin). The stored
delivery state is the *materialised* one: timers fire lazily, so a DELAYED or IN_FLIGHT
message whose ``visible_at_ms`` is due at the snapshot time is reported VISIBLE, exactly as
``queries.depth`` counts it. Messages past their retention period are gone logically (the next
sweep deletes them) and are left out, counted in ``ShardStats.expired``.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sqsq.core import keys, regions
from sqsq.core import records as r
from sqsq.core.attributes import render_queue_attributes
from sqsq.core.delivery import due_ms
from sqsq.core.records import Delivery, MessageRecord, QueueRecord
from sqsq.core.txn import KVReader, prefix_end

STATE_NAMES = {r.DELAYED: "DELAYED", r.VISIBLE: "VISIBLE", r.IN_FLIGHT: "IN_FLIGHT"}


@dataclass(frozen=True)
class SnapshotSource:
    """Where the rows come from: one shard's store as of ``as_of_ms``."""

    store: KVReader
    shard: int
    as_of_ms: int
    region: str = "us-east-1"
    account: str = "000000000000"
    include_bodies: bool = False

    def queue_arn(self, key: str) -> str:
        """A queue's ARN from its key (outside the configured region: "<region>/<name>")."""
        return regions.queue_arn(key, self.region, self.account)


@dataclass
class ShardStats:
    queues: int = 0
    messages: int = 0
    expired: int = 0
    applied_index: int = 0
    last_now_ms: int = 0
    states: dict[str, int] = field(default_factory=dict)


def logical_state(q: QueueRecord, d: Delivery, as_of_ms: int) -> int:
    """The state at ``as_of_ms``: a due timer counts as fired (see ``queries.depth``)."""
    if d.state in (r.DELAYED, r.IN_FLIGHT) and due_ms(q, d) <= as_of_ms:
        return r.VISIBLE
    return d.state


def queues_by_qid(src: SnapshotSource) -> dict[int, QueueRecord]:
    start = keys.queue_key("")
    return {q.qid: q for q in (QueueRecord.decode(v) for _, v in src.store.scan(start,
                                                                             prefix_end(start)))}


def queue_rows(src: SnapshotSource, queues: dict[int, QueueRecord]) -> list[dict[str, Any]]:
    arns = {src.queue_arn(q.name) for q in queues.values()}
    targets = {q.attributes.redrive_policy.dead_letter_target_arn
               for q in queues.values() if q.attributes.redrive_policy}
    rows = []
    for q in sorted(queues.values(), key=lambda q: q.name):
        a, rp, arn = q.attributes, q.attributes.redrive_policy, src.queue_arn(q.name)
        rows.append({
            "as_of_ms": src.as_of_ms, "qid": q.qid, "queue_name": q.name, "queue_arn": arn,
            "fifo": a.fifo_queue, "created_ms": q.created_ms, "modified_ms": q.modified_ms,
            "visibility_timeout_s": a.visibility_timeout_s, "delay_seconds": a.delay_seconds,
            "message_retention_period_s": a.message_retention_period_s,
            "maximum_message_size": a.maximum_message_size,
            "receive_message_wait_time_s": a.receive_message_wait_time_s,
            "dead_letter_target_arn": rp.dead_letter_target_arn if rp else None,
            "max_receive_count": rp.max_receive_count if rp else None,
            "dead_letter_target_exists": (rp.dead_letter_target_arn in arns) if rp else None,
            "is_dead_letter_queue": arn in targets,
            "redrive_allow_policy": a.redrive_allow_policy,
            "content_based_deduplication": a.content_based_deduplication,
            "deduplication_scope": a.deduplication_scope if a.fifo_queue else None,
            "fifo_throughput_limit": a.fifo_throughput_limit if a.fifo_queue else None,
            "last_purge_ms": q.last_purge_ms,
            "attributes": sorted(render_queue_attributes(a).items()),
            "tags": sorted(q.tags.items()),
        })
    return rows


def _attribute_value(a: Any) -> str:
    if a.string_value is not None:
        return a.string_value
    return base64.b64encode(a.binary_value or b"").decode()


def message_size(m: MessageRecord) -> int:
    """SQS's message size: body plus each attribute's name, type and value."""
    n = len(m.body.encode())
    for name, a in m.message_attributes:
        value = a.binary_value if a.string_value is None else a.string_value.encode()
        n += len(name.encode()) + len(a.data_type.encode()) + len(value or b"")
    return n


def message_and_delivery_rows(
    src: SnapshotSource, queues: dict[int, QueueRecord], stats: ShardStats, partition: int = 0,
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(message row, delivery row) per live message, in key order.

    ``partition`` is the queue partition this shard holds (0 in single-node mode).
    """
    start = b"d"
    for key, raw in src.store.scan(start, prefix_end(start)):
        qid, seq = keys.read_u64(key, 1), keys.read_u64(key, 9)
        q = queues.get(qid)
        if q is None:  # a deleted queue's incarnation awaiting garbage collection
            continue
        m_raw = src.store.get(keys.message_key(qid, seq))
        if m_raw is None:
            raise ValueError(f"delivery {qid}/{seq} has no message record")
        d, m = Delivery.decode(raw), MessageRecord.decode(m_raw)
        # Retention from d.sent_ms: the send, or a FIFO dead-letter move (which restarts it).
        if d.sent_ms + q.attributes.message_retention_period_s * 1000 <= src.as_of_ms:
            stats.expired += 1
            continue
        state = STATE_NAMES[logical_state(q, d, src.as_of_ms)]
        stats.messages += 1
        stats.states[state] = stats.states.get(state, 0) + 1
        common = {"as_of_ms": src.as_of_ms, "partition": partition, "qid": qid, "seq": seq,
                  "queue_name": q.name, "message_id": m.message_id}
        message = {
            **common, "sent_ms": m.sent_ms, "size_bytes": message_size(m),
            "body_size_bytes": len(m.body.encode()), "md5_of_body": m.md5_of_body,
            "group_id": m.group_id, "deduplication_id": m.deduplication_id,
            "attributes": [(n, _attribute_value(a)) for n, a in m.message_attributes],
            "attribute_types": [(n, a.data_type) for n, a in m.message_attributes],
            "dead_letter_source_arn": m.dead_letter_source_arn,
            "dead_lettered_ms": m.dead_lettered_ms,
            "body": m.body if src.include_bodies else None,
        }
        delivery = {
            **common, "state": state, "stored_state": STATE_NAMES[d.state],
            "receive_count": d.receive_count, "first_receive_ms": d.first_receive_ms or None,
            "visible_at_ms": due_ms(q, d),
        }
        yield message, delivery


def read_meta(src: SnapshotSource) -> r.Meta:
    return r.Meta.decode(src.store.get(keys.META_KEY))

