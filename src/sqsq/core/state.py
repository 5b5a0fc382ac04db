"""Typed access to one shard's state through a transaction; no rules live here."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqsq.core import records as r
from sqsq.core import regions
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


class Writer(KVReader):
    def put(self, key: bytes, value: bytes) -> None: ...
    def delete(self, key: bytes) -> None: ...


class ShardState:
    """One command's view: reads through, writes into the transaction, caches hot records.

    Counters and meta are cached for the duration of a command and written once by ``flush``.
    """

    def __init__(self, txn: Writer, config: ShardConfig) -> None:
        self.txn = txn
        self.config = config
        self._meta: Meta | None = None
        self._counters: dict[int, Counters] = {}

    # ---- meta ----
    @property
    def meta(self) -> Meta:
        if self._meta is None:
            self._meta = Meta.decode(self.txn.get(r.META_KEY))
        return self._meta

    def next_seq(self) -> int:
        seq = self.meta.next_seq
        self.meta.next_seq += 1
        return seq

    def next_qid(self) -> int:
        qid = self.meta.next_qid
        self.meta.next_qid += 1
        return qid

    def flush(self) -> None:
        if self._meta is not None:
            self.txn.put(r.META_KEY, self._meta.encode())
        for qid, c in self._counters.items():
            if c is not None:
                self.txn.put(r.counters_key(qid), c.encode())
        self._counters.clear()

    # ---- queues ----
    def queue(self, name: str) -> QueueRecord | None:
        raw = self.txn.get(r.queue_key(name))
        return QueueRecord.decode(raw) if raw else None

    def put_queue(self, q: QueueRecord) -> None:
        self.txn.put(r.queue_key(q.name), q.encode())

    def queues(self, prefix: str = "") -> Iterator[QueueRecord]:
        start = r.queue_key(prefix)
        for _, raw in self.txn.scan(start, prefix_end(start)):
            yield QueueRecord.decode(raw)

    def counters(self, qid: int) -> Counters:
        c = self._counters.get(qid)
        if c is None:
            c = Counters.decode(self.txn.get(r.counters_key(qid)))
            self._counters[qid] = c
        return c

    def drop_counters(self, qid: int) -> None:
        self._counters.pop(qid, None)
        self.txn.delete(r.counters_key(qid))

    # ---- messages ----
    def message(self, qid: int, seq: int) -> MessageRecord | None:
        raw = self.txn.get(r.message_key(qid, seq))
        return MessageRecord.decode(raw) if raw else None

    def delivery(self, qid: int, seq: int) -> Delivery | None:
        raw = self.txn.get(r.delivery_key(qid, seq))
        return Delivery.decode(raw) if raw else None

    def put_delivery(self, qid: int, seq: int, d: Delivery) -> None:
        self.txn.put(r.delivery_key(qid, seq), d.encode())

    def group(self, qid: int, group: str) -> GroupRecord:
        return GroupRecord.decode(self.txn.get(r.group_key(qid, group)))

    def put_group(self, qid: int, group: str, g: GroupRecord) -> None:
        self.txn.put(r.group_key(qid, group), g.encode())

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
        return self.scan_floored(index.encode() + r.u64(qid), getattr(c, field), until,
                                 lambda floor: setattr(c, field, floor))

    def scan_floored(
        self, prefix: bytes, floor: int, until: int | None, set_floor: Callable[[int], None]
    ) -> Iterator[tuple[bytes, bytes]]:
        """Keys ``prefix + u64(n) + ...`` with ``floor <= n (<= until)``, raising the floor:
        to the first live key's ``n``, or past ``until`` when a bounded scan finds nothing."""
        end = prefix_end(prefix) if until is None else prefix + r.u64(until + 1)
        start = prefix + r.u64(floor)
        first = True
        for key, value in self.txn.scan(start, end) if start < end else ():
            if first:
                first = False
                set_floor(r.read_u64(key, len(prefix)))
            yield key, value
        if first:
            set_floor(r.NO_FLOOR if until is None else max(floor, until + 1))

    def group_messages(self, qid: int, group: str) -> Iterator[bytes]:
        """Keys of a FIFO group's messages in send order, from the group's floor."""
        prefix = r.group_prefix(qid, group)
        floor = self.group(qid, group).floor
        first = True
        for key, _ in self.txn.scan(prefix + r.u64(floor), prefix_end(prefix)):
            if first:
                first = False
                seq = r.seq_of(key)
                if seq != floor:  # written at once: callers re-read the group record
                    g = self.group(qid, group)
                    g.floor = seq
                    self.put_group(qid, group, g)
            yield key
