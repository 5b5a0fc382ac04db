"""Typed access to one shard's state through a transaction; no rules live here."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqsq.core import keys, regions
from sqsq.core import records as r
from sqsq.core.records import Counters, Delivery, GroupRecord, MessageRecord, Meta, QueueRecord
from sqsq.core.txn import KVReader, prefix_end


@dataclass(frozen=True)
class ShardConfig:
    shard_id: int = 0
    secret: bytes = b"sqsq-dev-secret"
    region: str = "us-east-1"  # the home region: its queues' keys are their plain names
    account: str = "000000000000"

    def fingerprint(self) -> str:
        """What replicas must agree on: a digest of the configuration that replicated state
        depends on (handles are signed with the secret; ARNs carry region and account)."""
        h = hashlib.sha256()
        for part in (self.secret, self.region.encode(), self.account.encode()):
            h.update(len(part).to_bytes(4, "big") + part)
        return h.hexdigest()[:32]

    def queue_arn(self, key: str) -> str:
        """The ARN of the queue with this key (see ``sqsq.core.regions``)."""
        return regions.queue_arn(key, self.region, self.account)

    def key_of_arn(self, arn: str) -> str | None:
        """The key of the queue an ARN names, None for no queue of this account."""
        return regions.key_of_arn(arn, self.region, self.account)

    def region_of(self, key: str) -> str:
        return regions.region_of(key, self.region)


def sweep_due(q: QueueRecord, c: Counters) -> int:
    """The earliest time the sweep could have work in the queue, from its index floors: a
    timer (delay, visibility timeout) coming due, a FIFO message passing the queue's delay,
    a message reaching the retention period. ``NO_FLOOR`` when its timer indexes are empty."""
    due = c.w_floor
    if q.attributes.fifo_queue and c.y_floor != keys.NO_FLOOR:
        due = min(due, c.y_floor + q.attributes.delay_seconds * 1000)
    if c.r_floor != keys.NO_FLOOR:
        due = min(due, c.r_floor + q.attributes.message_retention_period_s * 1000)
    return min(due, keys.NO_FLOOR)


class Writer(KVReader):
    def put(self, key: bytes, value: bytes) -> None: ...
    def delete(self, key: bytes) -> None: ...


class ShardState:
    """One command's view: reads through, writes into the transaction, caches hot records.

    Counters and meta are cached for the duration of a command and written once by ``flush``.
    What ``flush`` wrote is handed to the next command of the same transaction (``Txn.memo``)
    instead of being decoded again from the bytes it just encoded: every command reads the
    meta, and nearly every one a queue's counters. The next command takes the record only if
    the transaction still holds those very bytes, and takes it over: a command that fails
    half-way leaves nothing behind that a rollback would not undo.
    """

    def __init__(self, txn: Writer, config: ShardConfig) -> None:
        self.txn = txn
        self.config = config
        memo = getattr(txn, "memo", None)
        self._memo: dict[bytes, tuple[bytes, object]] = {} if memo is None else memo
        self._meta: Meta | None = None
        self._counters: dict[int, Counters] = {}
        self._queues: dict[int, QueueRecord] = {}  # the records this command has seen, by qid
        # FIFO group records are read and written several times for each message a command
        # touches (head, floor, in-flight count): their keys, and their fields by the bytes
        # last read or written, are kept for the command. Each read still builds a record
        # of its own from the bytes the transaction holds now.
        self._group_keys: dict[tuple[int, str], bytes] = {}
        self._group_fields: dict[bytes, tuple[bytes, list]] = {}
        # Queue records by name, while only commands that never write one run over this
        # state (``machine.apply_commands``): a run of message commands reads each queue's
        # record once, not once per command. None: every read goes to the transaction.
        self._named: dict[str, QueueRecord | None] | None = None

    # ---- meta ----
    @property
    def meta(self) -> Meta:
        if self._meta is None:
            raw = self.txn.get(keys.META_KEY)
            held = self._memo.pop(keys.META_KEY, None)
            self._meta = held[1] if held is not None and held[0] is raw else Meta.decode(raw)  # type: ignore[assignment]
        return self._meta

    def next_seq(self) -> int:
        meta = self.meta
        seq = meta.next_seq
        meta.next_seq = seq + 1
        return seq

    def next_qid(self) -> int:
        qid = self.meta.next_qid
        self.meta.next_qid += 1
        return qid

    def flush(self) -> None:
        """Write the meta and counters; this state is done with them (see ``_memo``)."""
        memo, put = self._memo, self.txn.put
        if self._meta is not None:
            raw = self._meta.encode()
            put(keys.META_KEY, raw)
            memo[keys.META_KEY] = (raw, self._meta)
            self._meta = None
        for qid, c in self._counters.items():
            self._reschedule(qid, c)
            key, raw = keys.counters_key(qid), c.encode()
            put(key, raw)
            memo[key] = (raw, c)
        self._counters.clear()

    # ---- the sweep schedule (keys.sweep_key) ----
    def _reschedule(self, qid: int, c: Counters) -> None:
        """Keep the queue's place in the sweep schedule at its earliest possible due time. The
        floors are lower bounds, so the place is never late; a visit that finds nothing due
        settles the floors (``delivery.settle_floors``) and moves the place on."""
        q = self._queues.get(qid)
        if q is None or q.qid != qid:
            # Every command reads the record of a queue whose timers it touches; should one
            # not have, find it rather than leave the queue out of the schedule.
            q = next((x for x in self.queues() if x.qid == qid), None)
        due = keys.NO_FLOOR if q is None else sweep_due(q, c)
        if due != c.sweep_at:
            if c.sweep_at != keys.NO_FLOOR:
                self.txn.delete(keys.sweep_key(c.sweep_at, qid))
            if q is not None and due != keys.NO_FLOOR:
                self.txn.put(keys.sweep_key(due, qid), q.name.encode())
            c.sweep_at = due

    def schedule(self, q: QueueRecord) -> None:
        """Put the queue in the sweep schedule when this command's writes are flushed."""
        self._queues[q.qid] = q
        self.counters(q.qid)

    def due_queues(self, now: int) -> Iterator[tuple[bytes, int, str]]:
        """(schedule key, qid, name) of queues whose sweep is due at ``now``, earliest first."""
        for key, name in self.txn.scan(b"S", b"S" + keys.u64(now + 1)):
            yield key, keys.read_u64(key, 9), name.decode()

    # ---- queues ----
    def queue(self, name: str) -> QueueRecord | None:
        named = self._named
        if named is not None and name in named:
            return named[name]
        raw = self.txn.get(keys.queue_key(name))
        q = QueueRecord.decode(raw) if raw else None
        if q is not None:
            self._queues[q.qid] = q
        if named is not None:
            named[name] = q
        return q

    def share_queue_records(self) -> None:
        """From now on ``queue`` hands out the record it read before for the same name: for a
        state only commands that neither write nor change a queue record run over (their
        handlers read ``q``, never assign to it)."""
        self._named = {}

    def put_queue(self, q: QueueRecord) -> None:
        self.txn.put(keys.queue_key(q.name), q.encode())
        self.schedule(q)  # its delay or retention may have changed when it is due

    def queues(self, prefix: str = "") -> Iterator[QueueRecord]:
        start = keys.queue_key(prefix)
        for _, raw in self.txn.scan(start, prefix_end(start)):
            q = QueueRecord.decode(raw)
            self._queues[q.qid] = q
            yield q

    def counters(self, qid: int) -> Counters:
        c = self._counters.get(qid)
        if c is None:
            key = keys.counters_key(qid)
            raw = self.txn.get(key)
            held = self._memo.pop(key, None)
            c = held[1] if held is not None and held[0] is raw else Counters.decode(raw)  # type: ignore[assignment]
            self._counters[qid] = c
        return c

    def start_counters(self, qid: int) -> None:
        """A new queue incarnation's counters: every index is empty, so no floor holds it in
        the sweep schedule."""
        c = self.counters(qid)
        c.v_floor = c.w_floor = c.r_floor = c.k_floor = c.y_floor = keys.NO_FLOOR

    def drop_counters(self, qid: int) -> None:
        c = self.counters(qid)
        if c.sweep_at != keys.NO_FLOOR:
            self.txn.delete(keys.sweep_key(c.sweep_at, qid))
        self._counters.pop(qid, None)
        self.txn.delete(keys.counters_key(qid))

    # ---- messages ----
    def message(self, qid: int, seq: int) -> MessageRecord | None:
        raw = self.txn.get(keys.message_key(qid, seq))
        return MessageRecord.decode(raw) if raw else None

    def delivery(self, qid: int, seq: int) -> Delivery | None:
        raw = self.txn.get(keys.delivery_key(qid, seq))
        return Delivery.decode(raw) if raw else None

    def put_delivery(self, qid: int, seq: int, d: Delivery) -> None:
        self.txn.put(keys.delivery_key(qid, seq), d.encode())

    def group_key(self, qid: int, group: str) -> bytes:
        key = self._group_keys.get((qid, group))
        if key is None:
            key = self._group_keys[qid, group] = keys.group_key(qid, group)
        return key

    def group(self, qid: int, group: str) -> GroupRecord:
        fields = self._group_fields_of(qid, group)
        return GroupRecord() if fields is None else GroupRecord(*fields)

    def _group_floor(self, qid: int, group: str) -> int:
        """``group(qid, group).floor`` without building the record (asked for a few times
        per message of a FIFO queue, by every look at a group's head)."""
        fields = self._group_fields_of(qid, group)
        # A record from before the floor existed has two fields: its floor is the default.
        return fields[2] if fields is not None and len(fields) > 2 else GroupRecord.floor

    def _group_fields_of(self, qid: int, group: str) -> list | None:
        key = self.group_key(qid, group)
        raw = self.txn.get(key)
        if not raw:
            return None
        known = self._group_fields.get(key)
        if known is None or known[0] != raw:
            known = self._group_fields[key] = (raw, r.unpack(raw))
        return known[1]

    def put_group(self, qid: int, group: str, g: GroupRecord) -> None:
        key = self.group_key(qid, group)
        raw = g.encode()
        self.txn.put(key, raw)
        self._group_fields[key] = (raw, [g.in_flight, g.ready_key, g.floor, g.head_since_ms])

    def scan_prefix(
        self, prefix: bytes, start: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        return self.txn.scan(start or prefix, prefix_end(prefix))

    # ---- index floors (see Counters) ----
    def lower_floor(self, qid: int, index: str, value: int) -> None:
        c = self.counters(qid)
        if value < getattr(c, index):
            setattr(c, index, value)

    def scan_index(
        self, index: str, qid: int, until: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """A queue's index (``v``, ``w``, ``r`` or ``k``) from its floor, up to ``until``.

        The first live key seen raises the floor to itself; a bounded scan that finds nothing
        raises it past ``until``.
        """
        c = self.counters(qid)
        field = f"{index}_floor"
        return self.scan_floored(index.encode() + keys.u64(qid), getattr(c, field), until,
                                 lambda floor: setattr(c, field, floor))

    def scan_floored(
        self, prefix: bytes, floor: int, until: int | None, set_floor: Callable[[int], None]
    ) -> Iterator[tuple[bytes, bytes]]:
        """Keys ``prefix + u64(n) + ...`` with ``floor <= n (<= until)``, raising the floor:
        to the first live key's ``n``, or past ``until`` when a bounded scan finds nothing."""
        end = prefix_end(prefix) if until is None else prefix + keys.u64(until + 1)
        start = prefix + keys.u64(floor)
        first = True
        for key, value in self.txn.scan(start, end) if start < end else ():
            if first:
                first = False
                set_floor(keys.read_u64(key, len(prefix)))
            yield key, value
        if first:
            set_floor(keys.NO_FLOOR if until is None else max(floor, until + 1))

    def group_head(self, qid: int, group: str) -> int | None:
        """The seq of a FIFO group's oldest message (None: it has none), as the first key of
        ``group_messages`` gives it. The group's floor is at or below every message of the
        group, so when the floor's own message is there it is the head: one point read, not
        a scan (the head is asked for on every send, receive and delete of a group)."""
        prefix = keys.group_prefix(qid, group)
        floor = self._group_floor(qid, group)
        start = prefix + keys.u64(floor)
        if self.txn.get(start) is not None:
            return floor
        key = next(self._group_scan(qid, group, prefix, floor, start), None)
        return None if key is None else keys.seq_of(key)

    def group_messages(self, qid: int, group: str) -> Iterator[bytes]:
        """Keys of a FIFO group's messages in send order, from the group's floor."""
        prefix = keys.group_prefix(qid, group)
        floor = self._group_floor(qid, group)
        start = prefix + keys.u64(floor)
        if self.txn.get(start) is not None:
            # The floor's message is there, so it is the first: one point read, and a scan
            # only for a caller that wants more (a receive of one message does not).
            yield start
            yield from self._group_scan(qid, group, prefix, None, start + b"\x00")
        else:
            yield from self._group_scan(qid, group, prefix, floor, start)

    def _group_scan(self, qid: int, group: str, prefix: bytes, floor: int | None,
                    start: bytes) -> Iterator[bytes]:
        """The group's message keys from ``start``; the first one is the group's new floor
        unless ``floor`` is None (the floor's message was there)."""
        for key, _ in self.txn.scan(start, prefix_end(prefix)):
            if floor is not None:
                seq = keys.seq_of(key)
                if seq != floor:  # written at once: callers re-read the group record
                    g = self.group(qid, group)
                    g.floor = seq
                    self.put_group(qid, group, g)
                floor = None
            yield key
