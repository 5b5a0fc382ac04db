"""The applier, for ``RaftReplica``: committed entries handed over by the Ready loop are
applied to the state machine in order, a batch at a time (small batches on the event loop,
larger ones in a worker thread), and the proposals they carry answered.

A leader shares each entry's write set with its followers, and a follower writes the leader's
where it has it instead of applying the commands again (``sqsq.shard.writesets`` says why
that is the same store, and what a follower refuses).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqsq.raft import Entry, EntryKind
from sqsq.shard import writesets

log = logging.getLogger("sqsq.raft")


class Proposal(enum.Enum):
    COMMITTED = "committed"
    NOT_LEADER = "not leader"
    UNKNOWN = "outcome unknown"  # may or may not be committed: the caller must retry


Done = Callable[[Proposal, Any], None]

# Committed entries waiting for the applier past which the Ready loop waits for it (so a
# state machine slower than the disk does not let them pile up without bound).
MAX_APPLY_BACKLOG = 1024
# A batch of committed entries up to this much entry data is applied on the event loop: a
# worker thread's round trip (two wake-ups across threads, the GIL handed back and forth)
# costs more than the apply, which holds the GIL anyway, and the loop would mostly wait for
# it. A follower that writes the leader's write sets does the least work per byte; a leader
# applying the commands (and making the write sets) was measured with 4 KiB against 64 KiB
# here: 64 KiB gave sqsq-r3 steady-10x100B 123 against 141-162 us of CPU per message.
INLINE_APPLY_BYTES = 64 << 10
# A follower applies what it learns is committed once the first of it has waited this long,
# on the Ready that brings a commit (after its answers), in one store write for the write
# sets of the lot: nothing waits for a follower's apply (its state is read when it leads or
# takes a snapshot, and both apply what waits first), while a store write costs a replica
# 50-80 us of CPU in the server, its caches cold (15 us in a tight loop), and as much again
# around it, once per entry. If no commit comes, a timer applies it at the latest after the
# second figure: a timer of its own would wake the process once a batch (a shard's commits
# come further apart when a node holds several).
FOLLOWER_APPLY_LINGER_S = 0.01
FOLLOWER_APPLY_LATEST_S = 0.05


class Applier:
    """Mixed into ``RaftReplica`` (through ``ReadyLoop``), whose state it works on."""

    # A snapshot waits for the batch being applied, and no other starts meanwhile: a stream
    # of commits must not keep the applier busy for ever (``sqsq.shard.snapshotting``).
    _paused = False
    prepared_used = 0  # entries applied as prepared ahead (``_prepare_ahead``)

    def _hand_over(self, committed: Sequence[Entry], at_once: bool = False) -> None:
        """Give ``committed`` to the applier. ``at_once``: a leader with no applier running
        applies a small batch here and now, a turn of the event loop sooner than a task
        would (its callers wait for the answers); a follower applies it at the start of the
        loop's next turn (``_apply_soon``), once what it sent in this one has left, and once
        the first of them has waited ``FOLLOWER_APPLY_LINGER_S``."""
        if not committed or self.fatal is not None:
            return
        self._to_apply.extend(committed)
        if self._apply_due or self._paused or (
                self._applier is not None and not self._applier.done()):
            return  # it takes these too, in order (or a snapshot's checkpoint comes first)
        if at_once and not self._stopped:
            if not self.is_leader():
                loop = asyncio.get_running_loop()
                if self._apply_timer is None:  # the first of a batch: it waits
                    self._linger_from, self._linger_bytes = loop.time(), 0
                    self._apply_timer = loop.call_later(FOLLOWER_APPLY_LATEST_S,
                                                        self._apply_soon)
                self._linger_bytes += sum(len(e.data) for e in committed)
                # (and before the lot outgrows what the event loop applies itself)
                if loop.time() - self._linger_from >= FOLLOWER_APPLY_LINGER_S or \
                        self._linger_bytes > INLINE_APPLY_BYTES // 2:
                    self._apply_due = True
                    loop.call_soon(self._apply_soon)
                return
            if self._inline(self._to_apply):
                self._apply_here(self._share_with(), {})
                return
        self._applier = asyncio.create_task(self._apply_all(), name=f"apply-{self.shard_id}")

    def _apply_soon(self) -> None:
        """A follower's committed entries, applied in a callback rather than a task of their
        own (a task per Ready cost a follower about a tenth of its CPU per entry): after the
        transport's flush of the answers, which the leader's commit waits for, and after
        ``FOLLOWER_APPLY_LINGER_S``, so that one write takes several entries' write sets. A
        batch that must wait for a write set or go to a worker thread takes the task."""
        self._apply_due = False
        self._end_wait()
        if not self._to_apply or self.fatal is not None or self._stopped or self._paused or (
                self._applier is not None and not self._applier.done()):
            return
        share = self._share_with()
        awaited = None if share else self._write_set_awaited()
        if (awaited is not None and not self.write_sets.has(awaited)) or \
                not self._inline(self._to_apply):
            self._applier = asyncio.create_task(self._apply_all(),
                                                name=f"apply-{self.shard_id}")
            return
        self._apply_here(share, None)

    def _take_all(self) -> list[Entry]:
        """Everything handed over, taken to be applied: a follower's wait for company, if
        any, is over (it leads now, or the slow disk's path applies what is durable)."""
        batch, self._to_apply = self._to_apply, []
        self._end_wait()
        return batch

    def _end_wait(self) -> None:
        """A follower's wait for company (``FOLLOWER_APPLY_LINGER_S``) is over, if any."""
        if self._apply_timer is not None:
            self._apply_timer.cancel()
            self._apply_timer = None

    def _inline(self, batch: Sequence[Entry]) -> bool:
        """Whether to apply ``batch`` on the event loop rather than in a worker thread."""
        return sum(len(e.data) for e in batch) <= INLINE_APPLY_BYTES

    def _apply_here(self, share: frozenset[tuple[str, tuple[str, int]]],
                    received: dict[int, bytes] | None) -> None:
        """Everything handed over, applied on the event loop now (a small batch)."""
        batch = self._take_all()
        if received is None:
            received = {} if share else self._received_write_sets(batch)
        try:
            results, sets = self._apply_batch(batch, bool(share), received)
        except Exception as exc:  # a replica that cannot apply stops
            self._die(exc)
            return
        self._applied_batch(batch, share, results, sets)

    async def _apply_all(self) -> None:
        """Apply what was handed over, oldest first, a batch per worker-thread call; answer
        the proposals as their entries are applied. A leader shares each entry's write set
        with its followers; a follower writes the leader's where it has it, waiting a little
        for those it expects (``sqsq.shard.writesets``)."""
        while self._to_apply and self.fatal is None and not self._stopped and not self._paused:
            share = self._share_with()
            if not share:
                await self._await_write_sets()
            batch = self._take_all()
            inline = self._inline(batch)
            received = {} if share else self._received_write_sets(batch)
            try:
                if inline:
                    results, sets = self._apply_batch(batch, bool(share), received)
                else:
                    results, sets = await asyncio.to_thread(self._apply_batch, batch,
                                                            bool(share), received)
            except Exception as exc:  # a replica that cannot apply stops
                self._die(exc)
                return
            self._applied_batch(batch, share, results, sets)

    def _applied_batch(self, batch: list[Entry], share: frozenset[tuple[str, tuple[str, int]]],
                       results: dict[int, Any], sets: list[writesets.Shared]) -> None:
        """``batch`` is applied: its write sets shared, the reads and proposals that waited
        for it answered."""
        self._applied = max(self._applied, batch[-1].index)
        self.write_sets.forget_to(self._applied)
        if self._prepared:  # prepared by a leader that lost its lead, or behind a snapshot
            for index in [i for i in self._prepared if i <= self._applied]:
                del self._prepared[index]
        if sets and self.transport is not None:
            for node, address in share:
                self.transport.send_write_sets(node, address, self.shard_id, sets)
        if self._reads.waiting:
            self._serve_reads()  # reads that waited for this apply
        for e in batch:
            pending = self._proposals.pop(e.index, None)
            if pending is not None:
                term, done = pending
                ok = term == e.term and self.core is not None and \
                    self.core.is_leader() and self.core.term == term
                done(Proposal.COMMITTED if ok else Proposal.UNKNOWN, results.get(e.index))
            waiter = self._conf_waiters.pop(e.index, None)
            if waiter is not None:
                waiter[1](waiter[0] == e.term)
        if self._catching_up and self.core is not None:
            self._note_catch_up(self.core)

    def _prepare_ahead(self, entries: Sequence[Entry]) -> None:
        """A leader's entry just sent, applied ahead to a transaction (``ShardMachine.prepare``)
        while its followers write theirs: before the leader's own write where it can
        (``ReadyLoop._handle``), else after it. Once it is committed, the apply its callers
        wait for is a write of what that gave. On a lone send the commands' run
        was a tenth of the call, after the commit. Only the entry right after the applied
        one, while the applier is idle and the store holds every committed entry before
        it; only a small one (the event loop runs it); only one of this replica's
        proposals (someone waits for its answer). The applier uses it only for the very
        entry prepared (``_apply_batch``): which entry is committed at an index is Raft's
        to say, never the leader's."""
        machine = self.machine
        index = machine.applied_index + 1
        for e in entries:
            if e.index != index:
                continue
            if e.kind is not EntryKind.NORMAL or not e.data or e.index not in self._proposals \
                    or e.index in self._prepared or len(e.data) > INLINE_APPLY_BYTES \
                    or self._to_apply or self._paused or self._apply_due or (
                        self._applier is not None and not self._applier.done()):
                return
            pre = machine.prepare(e.index, e.data)
            if pre is not None:
                self._prepared[e.index] = pre
            return

    def _share_with(self) -> frozenset[tuple[str, tuple[str, int]]]:
        """The nodes a leader shares its write sets with (none unless leading)."""
        core = self.core
        if core is None or self.transport is None or not core.is_leader():
            return frozenset()
        return self.nodes()

    async def _await_write_sets(self) -> None:
        """While the leader shares write sets: until the one of the newest entry waiting
        that should have one has come, or ``writesets.WAIT_S`` passed."""
        index = self._write_set_awaited()
        if index is not None:
            await self.write_sets.wait(index)

    def _write_set_awaited(self) -> int | None:
        """The newest entry waiting whose write set a follower waits for (None: none)."""
        if not self.write_sets.sharing():
            return None
        for e in reversed(self._to_apply):
            if e.kind is EntryKind.NORMAL and writesets.expected(e.data):
                return e.index
        return None

    def _received_write_sets(self, batch: list[Entry]) -> dict[int, bytes]:
        take = self.write_sets.take
        out = {}
        for e in batch:
            if e.kind is EntryKind.NORMAL and e.data:
                blob = take(e.index, e.term, writesets.check(e.data))
                if blob is not None:
                    out[e.index] = blob
        return out

    def _apply_batch(self, batch: list[Entry], share: bool, received: dict[int, bytes]
                     ) -> tuple[dict[int, Any], list[writesets.Shared]]:
        """Apply the entries that carry commands (in a worker thread, or on the loop for a
        small batch): the outcomes by index, and the write sets to share (a leader's)."""
        machine, counts, prepared = self.machine, self.write_sets, self._prepared
        results: dict[int, Any] = {}
        sets: list[writesets.Shared] = []
        # A follower's write sets in a row, written as one: the last entry's Meta is the one
        # kept (it names that entry applied), and a later entry's write of a key wins.
        merged: dict[bytes, bytes | None] = {}
        last = 0
        for e in batch:
            if e.kind is not EntryKind.NORMAL or not e.data:
                continue
            if share:
                pre = prepared.pop(e.index, None) if prepared else None
                if pre is not None and pre.data == e.data and \
                        machine.applied_index == e.index - 1:
                    applied = machine.apply_prepared(pre)
                    self.prepared_used += 1
                else:
                    applied = machine.apply_entry_writes(e.index, e.data)
                if applied is not None:
                    counts.applied_self += 1
                    results[e.index] = applied[0]
                    if writesets.expected(e.data):
                        sets.append((e.index, e.term, writesets.check(e.data),
                                     writesets.pack(applied[1])))
                continue
            blob = received.get(e.index)
            if blob is not None:
                try:
                    writes = writesets.unpack(blob, e.index)
                except ValueError as exc:
                    log.warning("shard %d: the leader's write set of entry %d is not usable "
                                "(%s); applying the entry", self.shard_id, e.index, exc)
                else:
                    if e.index > machine.applied_index:
                        merged.update(writes)
                        last = e.index
                    counts.used += 1
                    continue
            if merged:
                machine.apply_writes(last, merged)
                merged = {}
            outcomes = machine.apply_entry(e.index, e.data)
            if outcomes is not None:
                counts.applied_self += 1
                results[e.index] = outcomes
        if merged:
            machine.apply_writes(last, merged)
        return results, sets

    async def _applied_all(self) -> None:
        """Wait until everything handed to the applier is applied."""
        while True:
            applier = self._applier
            if applier is not None and not applier.done():
                await asyncio.wait([applier])
            elif self._apply_due or self._apply_timer is not None:
                self._apply_soon()  # what waits, now (or it starts the task, awaited next)
            else:
                return
