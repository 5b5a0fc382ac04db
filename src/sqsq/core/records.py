"""What the shard stores: records, their encoding, and the keyspace.

Every key starts with a one-byte prefix; integers are big-endian so byte order is numeric
order. Values are msgpack lists (deterministic for equal input, so replicas stay identical).

| prefix | key                                   | value                     |
|--------|---------------------------------------|---------------------------|
| q      | name                                  | QueueRecord               |
| x      | name                                  | deleted-at ms             |
| c      | qid                                   | Counters                  |
| m      | qid seq                               | MessageRecord (append-only) |
| d      | qid seq                               | Delivery                  |
| v      | qid visible_at seq                    | visible index (standard queues) |
| w      | qid deadline seq                      | timer index: delayed or in flight |
| y      | qid sent_ms seq                       | FIFO: delayed (due: + queue delay) |
| r      | qid enqueued_ms seq                   | retention index           |
| f      | qid group 0x00 seq                    | FIFO: a group's messages in order |
| g      | qid group                             | FIFO: GroupRecord         |
| k      | qid head_seq group                    | FIFO: groups ready to deliver |
| u      | qid scope 0x00 dedup id               | Dedup record              |
| a      | qid attempt id                        | FIFO: ReceiveAttempt      |
| e      | at_ms u-key or a-key                  | expiry index of both windows |
| t      | source 0x00 started_ms handle         | message move task         |
| h      | task handle                           | its t-key                 |
| z      | qid                                   | garbage: a retired queue incarnation |
| s      |                                       | Meta: seqs, qids, last now, index |
| o      |                                       | cluster configuration fingerprint |
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field

import msgpack

from sqsq.core.attributes import QueueAttributes, RedrivePolicy
from sqsq.core.messages import MessageAttributeValue

_U64 = struct.Struct(">Q")
# The fixed-width keys in one struct call each: concatenating u64() pieces costs ~3x more,
# and keys are built several times per message.
_ID_SEQ = struct.Struct(">cQQ")  # prefix qid seq
_ID_AT_SEQ = struct.Struct(">cQQQ")  # prefix qid n seq
_ID = struct.Struct(">cQ")  # prefix qid (or a time)

DELAYED, VISIBLE, IN_FLIGHT = 0, 1, 2
TIMER_DELAYED, TIMER_IN_FLIGHT = b"d", b"i"


def u64(n: int) -> bytes:
    return _U64.pack(n)


def read_u64(b: bytes, offset: int = 0) -> int:
    return _U64.unpack_from(b, offset)[0]


def seq_of(key: bytes) -> int:
    """The message seq that ends every per-message index key."""
    return _U64.unpack_from(key, len(key) - 8)[0]


# One Packer for every record: ``msgpack.packb`` builds a new Packer per call, which costs
# ~3x the packing itself. Sharing it is safe: packing plain lists, ints, strs, bytes and None
# calls no Python code, so a ``pack`` runs to its end under the GIL, and it resets after each.
_PACKER = msgpack.Packer(use_bin_type=True)
# msgpack's own functions, not wrappers: a message's life packs and unpacks a dozen records,
# and a wrapper's frame cost a fifth of each. ``unpackb`` decodes strings to str (raw=False)
# by default since msgpack 1.0 (pinned: 1.2.4); test_records holds that.
pack = _PACKER.pack
unpack = msgpack.unpackb


# ---- keys -----------------------------------------------------------------------------------

META_KEY = b"s"
CONFIG_KEY = b"o"


def queue_key(name: str) -> bytes:
    return b"q" + name.encode()


def deleted_key(name: str) -> bytes:
    return b"x" + name.encode()


def counters_key(qid: int) -> bytes:
    return _ID.pack(b"c", qid)


def message_key(qid: int, seq: int) -> bytes:
    return _ID_SEQ.pack(b"m", qid, seq)


def delivery_key(qid: int, seq: int) -> bytes:
    return _ID_SEQ.pack(b"d", qid, seq)


def visible_key(qid: int, visible_at: int, seq: int) -> bytes:
    return _ID_AT_SEQ.pack(b"v", qid, visible_at, seq)


def timer_key(qid: int, deadline: int, seq: int) -> bytes:
    return _ID_AT_SEQ.pack(b"w", qid, deadline, seq)


def fifo_delay_key(qid: int, sent_ms: int, seq: int) -> bytes:
    return _ID_AT_SEQ.pack(b"y", qid, sent_ms, seq)


def retention_key(qid: int, enqueued_ms: int, seq: int) -> bytes:
    return _ID_AT_SEQ.pack(b"r", qid, enqueued_ms, seq)


def group_message_key(qid: int, group: str, seq: int) -> bytes:
    return _ID.pack(b"f", qid) + group.encode() + b"\x00" + _U64.pack(seq)


def group_prefix(qid: int, group: str) -> bytes:
    return _ID.pack(b"f", qid) + group.encode() + b"\x00"


def group_key(qid: int, group: str) -> bytes:
    return _ID.pack(b"g", qid) + group.encode()


def ready_group_key(qid: int, since_ms: int, head_seq: int, group: str) -> bytes:
    """A receivable FIFO group, ordered by when it became receivable (then its head)."""
    return _ID_AT_SEQ.pack(b"k", qid, since_ms, head_seq) + group.encode()


def ready_group_of(key: bytes) -> tuple[int, str]:
    """(head seq, group) of a ready_group_key."""
    return read_u64(key, 17), key[25:].decode()


def dedup_key(qid: int, scope: str, dedup_id: str) -> bytes:
    return _ID.pack(b"u", qid) + scope.encode() + b"\x00" + dedup_id.encode()


def attempt_key(qid: int, attempt_id: str) -> bytes:
    return _ID.pack(b"a", qid) + attempt_id.encode()


def dedup_expiry_key(at_ms: int, ukey: bytes) -> bytes:
    return _ID.pack(b"e", at_ms) + ukey


def garbage_key(qid: int) -> bytes:
    return _ID.pack(b"z", qid)


def sweep_key(due_ms: int, qid: int) -> bytes:
    """The sweep schedule: a queue is looked at once ``due_ms`` has come (the value is its
    name). One entry per queue, so the sweep visits only queues with timers due, never all."""
    return _ID_SEQ.pack(b"S", due_ms, qid)


NO_FLOOR = 2**63  # an empty index: any insert lowers the floor again

# Every prefix whose keys start with the queue id: what garbage collection clears. Dedup
# records (u) are not among them: they outlive a purge and leave through their expiry index.
QUEUE_SCOPED_PREFIXES = (b"c", b"d", b"f", b"g", b"k", b"m", b"r", b"v", b"w", b"y")  # in order


# ---- records ----------------------------------------------------------------------------


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
