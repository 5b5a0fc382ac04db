"""The shard's keyspace: every key's layout, and the numbers read back out of keys.

Every key starts with a one-byte prefix; integers are big-endian so byte order is numeric
order. The values are records (sqsq.core.records) or, in an index, what the index holds.

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

import struct

_U64 = struct.Struct(">Q")
# The fixed-width keys in one struct call each: concatenating u64() pieces costs ~3x more,
# and keys are built several times per message.
_ID_SEQ = struct.Struct(">cQQ")  # prefix qid seq
_ID_AT_SEQ = struct.Struct(">cQQQ")  # prefix qid n seq
_ID = struct.Struct(">cQ")  # prefix qid (or a time)


def u64(n: int) -> bytes:
    return _U64.pack(n)


def read_u64(b: bytes, offset: int = 0) -> int:
    return _U64.unpack_from(b, offset)[0]


def seq_of(key: bytes) -> int:
    """The message seq that ends every per-message index key."""
    return _U64.unpack_from(key, len(key) - 8)[0]


META_KEY = b"s"
CONFIG_KEY = b"o"
# What a timer index entry holds: whether the message waits to be shown or to come back.
TIMER_DELAYED, TIMER_IN_FLIGHT = b"d", b"i"


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
