"""A replica's state machine in the simulator: the real ``sqsq.core`` over an in-memory store.

Each applied entry extends a hash chain (index, term, data), as hashicorp/raft's fuzzer does:
two replicas that applied the same sequence have the same chain at every index, and a
replica that skipped, repeated or altered an entry has a different one from there on. The
chain and the applied index live in the state, so a snapshot carries them.

A second chain covers what each entry wrote: a follower writes the leader's write set instead
of running the commands (as ``sqsq.shard.writesets`` has it), and two replicas whose stores
were written differently at some index have different write chains from there on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from sortedcontainers import SortedDict

from sqsq.core import commands as c
from sqsq.core.entry import decode_entry
from sqsq.core.machine import apply_commands, effective_now
from sqsq.core.state import ShardConfig
from sqsq.core.txn import Txn
from sqsq.raft import Entry, EntryKind

CONFIG = ShardConfig(shard_id=1, secret=b"sim-secret-" + b"x" * 32)


class DictStore:
    """The store's in-memory twin, reduced to what ``core`` reads: get and ordered scans."""

    def __init__(self, items: dict[bytes, bytes] | None = None) -> None:
        self.d: SortedDict = SortedDict(items or {})

    def get(self, key: bytes) -> bytes | None:
        return self.d.get(key)

    def scan(self, start: bytes, end: bytes, *, reverse: bool = False
             ) -> Iterator[tuple[bytes, bytes]]:
        keys = list(self.d.irange(start, end, (True, False), reverse))
        for k in keys:
            v = self.d.get(k)
            if v is not None:
                yield k, v


@dataclass(frozen=True)
class MachineSnapshot:
    """The state as of ``applied``: what a Raft snapshot carries."""

    applied: int
    chain: bytes
    items: tuple[tuple[bytes, bytes], ...]
    writes_chain: bytes = b""


@dataclass(frozen=True)
class Applied:
    index: int
    term: int
    chain: bytes
    outcomes: tuple[c.Outcome, ...] | None  # None: a no-op or membership entry, or written
    commands: tuple = ()                      # from a write set
    writes_chain: bytes = b""
    writes: dict[bytes, bytes | None] | None = None  # what it wrote (a command entry's)


@dataclass(frozen=True)
class Prepared:
    """An entry's apply worked out before its commit (as ``ShardMachine.prepare``)."""

    index: int
    data: bytes
    outcomes: tuple[c.Outcome, ...]
    commands: tuple
    writes: dict[bytes, bytes | None]


class SimMachine:
    def __init__(self, snapshot: MachineSnapshot | None = None) -> None:
        if snapshot is None:
            snapshot = MachineSnapshot(0, b"", ())
        self.store = DictStore(dict(snapshot.items))
        self.applied = snapshot.applied
        self.chain = snapshot.chain
        self.writes_chain = snapshot.writes_chain

    def prepare(self, entry: Entry) -> Prepared | None:
        """``entry``'s commands run over the store as it stands, nothing written: for the
        entry right after the applied one (``apply`` takes it once committed)."""
        if entry.index != self.applied + 1 or entry.kind is not EntryKind.NORMAL \
                or not entry.data:
            return None
        return Prepared(entry.index, entry.data, *self._run(entry))

    def _run(self, entry: Entry) -> tuple[tuple[c.Outcome, ...], tuple, dict[bytes, bytes | None]]:
        """``entry``'s commands run over the store, as a replica applies an entry (a run of
        message commands shares a state): the outcomes, the commands and what they wrote."""
        decoded = decode_entry(entry.data)
        txn = Txn(self.store)
        outcomes = tuple(apply_commands(txn, CONFIG, decoded.commands, decoded.now_ms))
        return outcomes, decoded.commands, txn.writes()

    def apply(self, entry: Entry, shared: dict[bytes, bytes | None] | None = None,
              prepared: Prepared | None = None) -> Applied:
        """Apply ``entry``: run its commands, or write ``shared`` (the leader's write set of
        this very entry) or what preparing it gave instead."""
        if entry.index != self.applied + 1:
            raise AssertionError(f"applying {entry.index} after {self.applied}")
        self.chain = hashlib.blake2b(
            self.chain + entry.index.to_bytes(8, "big") + entry.term.to_bytes(8, "big")
            + bytes([entry.kind]) + entry.data, digest_size=16).digest()
        self.applied = entry.index
        outcomes, commands, writes = None, (), None
        if entry.kind is EntryKind.NORMAL and entry.data:
            if prepared is not None:
                outcomes, commands, writes = \
                    prepared.outcomes, prepared.commands, prepared.writes
            elif shared is not None:
                writes = shared
            else:
                outcomes, commands, writes = self._run(entry)
            for k, v in writes.items():
                if v is None:
                    self.store.d.pop(k, None)
                else:
                    self.store.d[k] = v
            self.writes_chain = hashlib.blake2b(
                self.writes_chain + entry.index.to_bytes(8, "big")
                + b"".join(len(k).to_bytes(4, "big") + k + (b"-" if v is None else
                           len(v).to_bytes(4, "big") + v) for k, v in sorted(writes.items())),
                digest_size=16).digest()
        return Applied(entry.index, entry.term, self.chain, outcomes, commands,
                       self.writes_chain, writes)

    def snapshot(self) -> MachineSnapshot:
        return MachineSnapshot(self.applied, self.chain, tuple(self.store.d.items()),
                               self.writes_chain)

    def last_now_ms(self) -> int:
        return effective_now(Txn(self.store), 0)

    def query(self, fn, *args):  # type: ignore[no-untyped-def]
        """A read-only query of ``core`` against the state as it stands."""
        return fn(Txn(self.store), *args)
