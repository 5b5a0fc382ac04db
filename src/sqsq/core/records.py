"""What the shard stores: its records and their encoding (their keys: sqsq.core.keys).

Values are msgpack lists (deterministic for equal input, so replicas stay identical).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import msgpack

from sqsq.core.attributes import QueueAttributes
from sqsq.core.keys import NO_FLOOR
from sqsq.core.messages import MessageAttributeValue
from sqsq.core.redrivepolicy import RedrivePolicy

DELAYED, VISIBLE, IN_FLIGHT = 0, 1, 2  # Delivery.state

# One Packer for every record: ``msgpack.packb`` builds a new Packer per call, which costs
# ~3x the packing itself. Sharing it is safe: packing plain lists, ints, strs, bytes and None
# calls no Python code, so a ``pack`` runs to its end under the GIL, and it resets after each.
_PACKER = msgpack.Packer(use_bin_type=True)
# msgpack's own functions, not wrappers: a message's life packs and unpacks a dozen records,
# and a wrapper's frame cost a fifth of each. ``unpackb`` decodes strings to str (raw=False)
# by default since msgpack 1.0 (pinned: 1.2.4); test_records holds that.
pack = _PACKER.pack
unpack = msgpack.unpackb


@dataclass
class Meta:
    next_seq: int = 1
    next_qid: int = 1
    last_now_ms: int = 0
    applied_index: int = 0
    e_floor: int = 0  # dedup expiry index: no live entry expires earlier
    # 1 once every queue is in the sweep schedule (state written before it existed has none).
    sweep_scheduled: int = 0

    def encode(self) -> bytes:
        return pack([self.next_seq, self.next_qid, self.last_now_ms, self.applied_index,
                     self.e_floor, self.sweep_scheduled])

    @classmethod
    def decode(cls, raw: bytes | None) -> Meta:
        return cls(*unpack(raw)) if raw else cls(sweep_scheduled=1)  # new: nothing to enter


def _encode_attributes(a: QueueAttributes) -> list:
    rp = a.redrive_policy
    return [
        a.visibility_timeout_s,
        a.delay_seconds,
        a.message_retention_period_s,
        a.maximum_message_size,
        a.receive_message_wait_time_s,
        [rp.dead_letter_target_arn, rp.max_receive_count] if rp else None,
        a.redrive_allow_policy,
        a.fifo_queue,
        a.content_based_deduplication,
        a.deduplication_scope,
        a.fifo_throughput_limit,
        [list(p) for p in a.extra],
        a.deduplication_scope_in_effect,
    ]


def _decode_attributes(v: list) -> QueueAttributes:
    return QueueAttributes(
        visibility_timeout_s=v[0],
        delay_seconds=v[1],
        message_retention_period_s=v[2],
        maximum_message_size=v[3],
        receive_message_wait_time_s=v[4],
        redrive_policy=RedrivePolicy(v[5][0], v[5][1]) if v[5] else None,
        redrive_allow_policy=v[6],
        fifo_queue=v[7],
        content_based_deduplication=v[8],
        deduplication_scope=v[9],
        fifo_throughput_limit=v[10],
        extra=tuple((k, s) for k, s in v[11]),
        deduplication_scope_in_effect=v[12] if len(v) > 12 else None,
    )


@dataclass
class QueueRecord:
    qid: int
    name: str
    attributes: QueueAttributes
    created_ms: int
    modified_ms: int
    tags: dict[str, str] = field(default_factory=dict)
    last_purge_ms: int | None = None
    # A purge starts a new incarnation (qid) and a new FIFO deduplication window, but client
    # request ids (standard queues' idempotent retries) stay under the first incarnation's
    # id. None: the same as qid.
    dedup_qid: int | None = None

    @property
    def dedup_scope_qid(self) -> int:
        return self.qid if self.dedup_qid is None else self.dedup_qid

    def encode(self) -> bytes:
        return pack(
            [
                self.qid,
                self.name,
                _encode_attributes(self.attributes),
                self.created_ms,
                self.modified_ms,
                sorted(self.tags.items()),
                self.last_purge_ms,
                self.dedup_qid,
            ]
        )

    @classmethod
    def decode(cls, raw: bytes) -> QueueRecord:
        qid, name, attributes, created_ms, modified_ms, tags, *later = _queue_fields(raw)
        # A new record (and tags dict) every time: handlers change the one they are given.
        return cls(qid, name, attributes, created_ms, modified_ms, dict(tags), *later)


@functools.lru_cache(maxsize=256)
def _queue_fields(raw: bytes) -> tuple:
    """A queue record's decoded fields, memoised by its bytes: every command on a queue reads
    its record, and decoding the attributes costs more than the command's own bookkeeping.
    Only immutable values are shared (QueueAttributes is frozen, tags come as pairs).
    Fields added later (dedup_qid) may be missing from old records: defaults then."""
    v = unpack(raw)
    return (v[0], v[1], _decode_attributes(v[2]), v[3], v[4], tuple(map(tuple, v[5])),
            *v[6:8])


@dataclass
class Counters:
    """Materialised depth per state; queries correct for timers that are due but not swept."""

    visible: int = 0
    in_flight: int = 0
    delayed: int = 0
    # Floors: a lower bound of the first live key's leading number in each index of the queue.
    # Scans start there, so they do not wade through the deletion tombstones RocksDB keeps
    # at the front of an index until compaction (cost per operation stays flat).
    v_floor: int = 0  # visible index: visible_at
    w_floor: int = 0  # timer index: deadline
    r_floor: int = 0  # retention index: enqueued_ms
    k_floor: int = 0  # FIFO ready groups: receivable since (ms)
    y_floor: int = 0  # FIFO delayed messages: sent_ms
    sweep_at: int = NO_FLOOR  # where the queue is in the sweep schedule (NO_FLOOR: nowhere)

    def encode(self) -> bytes:
        return pack([self.visible, self.in_flight, self.delayed, self.v_floor, self.w_floor,
                     self.r_floor, self.k_floor, self.y_floor, self.sweep_at])

    @classmethod
    def decode(cls, raw: bytes | None) -> Counters:
        return cls(*unpack(raw)) if raw else cls()

    def add(self, state: int, n: int) -> None:
        if state == VISIBLE:
            self.visible += n
        elif state == IN_FLIGHT:
            self.in_flight += n
        else:
            self.delayed += n


@dataclass
class MessageRecord:
    message_id: str
    body: str
    message_attributes: tuple[tuple[str, MessageAttributeValue], ...]
    sent_ms: int
    md5_of_body: str
    md5_of_message_attributes: str | None
    group_id: str | None = None
    deduplication_id: str | None = None
    dead_letter_source_arn: str | None = None
    dead_lettered_ms: int | None = None  # when it was moved to this dead-letter queue
    aws_trace_header: str | None = None

    def encode(self) -> bytes:
        return self.encode_fields(
            self.message_id, self.body, self.message_attributes, self.sent_ms,
            self.md5_of_body, self.md5_of_message_attributes, self.group_id,
            self.deduplication_id, self.dead_letter_source_arn, self.dead_lettered_ms,
            self.aws_trace_header)

    @staticmethod
    def encode_fields(message_id: str, body: str,
                      message_attributes: tuple[tuple[str, MessageAttributeValue], ...],
                      sent_ms: int, md5_of_body: str, md5_of_message_attributes: str | None,
                      group_id: str | None = None, deduplication_id: str | None = None,
                      dead_letter_source_arn: str | None = None,
                      dead_lettered_ms: int | None = None,
                      aws_trace_header: str | None = None) -> bytes:
        """``encode`` of the record these fields make, without making it (one per send)."""
        attrs = [
            [n, a.data_type, a.string_value, a.binary_value]
            for n, a in message_attributes
        ] if message_attributes else []
        return pack([message_id, body, attrs, sent_ms, md5_of_body, md5_of_message_attributes,
                     group_id, deduplication_id, dead_letter_source_arn, dead_lettered_ms,
                     aws_trace_header])

    @classmethod
    def decode(cls, raw: bytes) -> MessageRecord:
        v = unpack(raw)
        attrs = tuple([(n, MessageAttributeValue(t, s, b)) for n, t, s, b in v[2]]) if v[2] \
            else ()
        return cls(v[0], v[1], attrs, *v[3:])  # records from before a new field: its default


@dataclass
class Delivery:
    """The per-message delivery state. ``epoch`` is the receive count: it fences handles."""

    state: int
    visible_at_ms: int  # DELAYED: when it shows; IN_FLIGHT: when it comes back; VISIBLE: since
    receive_count: int = 0
    first_receive_ms: int = 0
    group_id: str | None = None
    sent_ms: int = 0  # when retention starts counting (the send, or a FIFO DLQ move)
    # The latest receive: SQS caps visibility at 12 hours from it. Last, so records written
    # before it existed still decode (as 0: no cap known).
    received_ms: int = 0

    def encode(self) -> bytes:
        return pack(
            [
                self.state,
                self.visible_at_ms,
                self.receive_count,
                self.first_receive_ms,
                self.group_id,
                self.sent_ms,
                self.received_ms,
            ]
        )

    @classmethod
    def decode(cls, raw: bytes) -> Delivery:
        return cls(*unpack(raw))


@dataclass
class GroupRecord:
    in_flight: int = 0
    ready_key: bytes | None = None
    floor: int = 0  # no live message of the group has a lower seq (skips tombstones)
    head_since_ms: int = 0  # when the current head became the head (its predecessor left)

    def encode(self) -> bytes:
        return pack([self.in_flight, self.ready_key, self.floor, self.head_since_ms])

    @classmethod
    def decode(cls, raw: bytes | None) -> GroupRecord:
        return cls(*unpack(raw)) if raw else cls()


@dataclass
class DedupRecord:
    message_id: str
    sequence_number: str | None
    md5_of_message_body: str
    md5_of_message_attributes: str | None
    expires_ms: int

    def encode(self) -> bytes:
        return self.encode_fields(self.message_id, self.sequence_number,
                                  self.md5_of_message_body, self.md5_of_message_attributes,
                                  self.expires_ms)

    @staticmethod
    def encode_fields(message_id: str, sequence_number: str | None, md5_of_message_body: str,
                      md5_of_message_attributes: str | None, expires_ms: int) -> bytes:
        """``encode`` of the record these fields make, without making it (one per send)."""
        return pack([message_id, sequence_number, md5_of_message_body,
                     md5_of_message_attributes, expires_ms])

    @classmethod
    def decode(cls, raw: bytes) -> DedupRecord:
        return cls(*unpack(raw))


@dataclass
class ReceiveAttempt:
    """A FIFO receive that a retry with the same ReceiveRequestAttemptId gets back, as long as
    none of its messages has been deleted, changed or timed out since."""

    nonce: int  # the receive's, so the retry's receipt handles are the same strings
    messages: list[tuple[int, int]]  # (seq, receive count at that receive)
    expires_ms: int
    deadline_ms: int  # when they come back, unless a visibility change moved it since

    def encode(self) -> bytes:
        return pack([self.nonce, [list(m) for m in self.messages], self.expires_ms,
                     self.deadline_ms])

    @classmethod
    def decode(cls, raw: bytes) -> ReceiveAttempt:
        nonce, messages, expires_ms, deadline_ms = unpack(raw)
        return cls(nonce, [(seq, count) for seq, count in messages], expires_ms, deadline_ms)


def window_expires_ms(key: bytes, raw: bytes) -> int:
    """When a record in the expiry index (a dedup record or a receive attempt) runs out."""
    if key[:1] == b"a":
        return ReceiveAttempt.decode(raw).expires_ms
    return DedupRecord.decode(raw).expires_ms
