"""The host's side of the Ready contract, for ``RaftReplica``: each ``Ready`` installed,
persisted, sent and applied, the proposals it carries answered, the Raft clock ticked, and
snapshots taken. Two steps overlap where Raft allows it: committed entries that are already
durable here are applied while the Ready's new entries are being fsynced (an applier task,
``sqsq.shard.applier``, takes them in order), and a leader sends its appends while it writes
its own copy (it counts itself only once that is durable). Large RocksDB batches run in
worker threads; a leader's writes go to the node's writer thread, batched with its other
replicas' (``raftstorage.Writes``); a follower's small write runs on the event loop while
the disk is fast (``_write_inline``). A Ready that only commits is acted on in the turn of
the message that brought the commit (``_ready_now``), and one written on the loop in the turn
of the proposal or the append that made it (``_ready_at_once``). The core is only ever touched
on the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Sequence

from sqsq.raft import (
    Entry,
    HardState,
    Message,
    MsgType,
    RaftNode,
    Ready,
    Role,
)
from sqsq.shard.applier import MAX_APPLY_BACKLOG, Applier, Proposal
from sqsq.shard.raftclock import RaftClock, node_of
from sqsq.shard.snapshotting import Snapshotting

log = logging.getLogger("sqsq.raft")


# A follower's write of a Ready this small is done on the event loop while the disk's recent
# writes took no longer than this on average (``_write_inline``).
INLINE_WRITE_BYTES = 64 << 10
INLINE_WRITE_S = 0.001
# What a leader may send before its own write of the same Ready is durable (``_sent_early``).
_EARLY = frozenset({MsgType.APPEND, MsgType.HEARTBEAT})


class ReadyLoop(Applier, Snapshotting, RaftClock):
    """Mixed into ``RaftReplica``, whose state it works on."""

    # ---- the Ready loop ------------------------------------------------------------------

    # True while a Ready is being worked on (the Ready loop's turn, or ``_ready_at_once``):
    # the core hands out one Ready at a time, and no other is taken until it is advanced.
    _turning = False
    # A Ready ``_ready_at_once`` took and left to the Ready loop (a write for the worker
    # thread, or a snapshot to install): the loop's next turn takes it first.
    _held: Ready | None = None

    async def _run(self) -> None:
        """Each Ready's writes, then its messages. Its committed entries go to the applier
        (``_apply_all``). When the write goes to a worker thread, those already durable here
        go at once, so they are applied while this Ready's entries are being persisted (the
        fsync of the next batch overlaps the apply of the last); the rest once the write is
        done. When the write runs on the loop (or there is none), all of them go after the
        Ready's messages: a follower's answers leave before it applies anything, since the
        leader's commit waits for them and nothing waits for the follower's apply. The core
        counts an entry applied once it is handed over (it hands each out once); what the
        state machine really applied is ``raftLastApplied``."""
        core = self.core
        assert core is not None
        while not self._stopped:
            await self._kick.wait()
            self._kick.clear()
            self._turning = True
            try:
                if not await self._turn(core):
                    return
            finally:
                self._turning = False

    def _active(self) -> None:
        if self._clock_stopped is not None:
            self._clock_stopped.set()  # the clock counts again (``_ticker``)
            self._clock_stopped = None
        if self.on_active is not None:
            self.on_active()  # the host's clock, if it slowed down, keeps Raft's pace

    async def _turn(self, core: RaftNode) -> bool:
        """One turn of the Ready loop: every Ready there is. False once the replica died."""
        self._active()
        self._note_role(core)
        while (self._held is not None or core.has_ready()) and self.fatal is None:
            rd, self._held = self._held, None
            if rd is None:
                rd = core.ready()
                self.readies += 1
            later = rd.committed
            inline = self._write_inline(rd)
            if rd.snapshot is None and rd.committed and not inline and self._writes(rd):
                new = rd.entries[0].index if rd.entries else rd.committed[-1].index + 1
                cut = sum(1 for e in rd.committed if e.index < new)
                self._hand_over(rd.committed[:cut])
                later = rd.committed[cut:]
            try:
                await self._handle(rd, inline)
            except Exception as exc:  # a replica that cannot persist or apply stops
                self._die(exc)
                return False
            core.advance(rd)
            self._hand_over(later, at_once=True)
            if self.fatal is not None:
                return False  # the apply failed (``_die``)
            if rd.entries and self._proposals and core.is_leader():
                self._prepare_ahead(rd.entries)  # unless done before the write
            if len(self._to_apply) > MAX_APPLY_BACKLOG:
                await self._applied_all()  # the disk outruns the state machine
            if rd.read_states or self._reads.out or self._reads.waiting:
                self._serve_reads(rd.read_states)
            self._note_role(core)
            if self._catching_up:
                self._note_catch_up(core)
            await self._snapshot_turn()
        if self.fatal is None:
            await self._snapshot_turn()  # due after a Ready taken by ``_ready_now``
        return True

    def _ready_now(self, core: RaftNode) -> bool:
        """Act on a Ready that only commits here and now, in the turn of the message that
        brought the commit (a leader's quorum of answers), rather than in the Ready loop's
        task a turn later: it has nothing to persist or send, so what it commits goes
        straight to the applier (a small batch of a leader's applied and answered at once).
        Only while the Ready loop holds no Ready and the applier has nothing waiting (but a
        follower's apply that waits for company); False if it did not (the Ready loop takes
        it)."""
        if self._stopped or (self._to_apply and self._apply_timer is None) or \
                self._apply_due or not core.commit_only() or (
                self._applier is not None and not self._applier.done()):
            return False
        rd = core.ready()
        self.readies += 1
        core.advance(rd)
        self._hand_over(rd.committed, at_once=True)
        if self.fatal is None:  # (else the apply failed: ``_die``)
            self._advanced(core, rd)
        return True

    def _ready_at_once(self, core: RaftNode) -> bool:
        """Act on the next Ready here and now, in the turn of the proposal or the append
        that made it, rather than in the Ready loop's task a turn later, when its write runs
        on the event loop anyway (``_write_inline``): a leader's appends, and a follower's
        answer, leave that much sooner. On a lone send each of the two hand-offs to the task
        was about 25 us on the commit's path. Only while no Ready is being worked on, the
        disk is fast and the applier keeps up; a Ready that turns out to need the worker
        thread or a snapshot install goes to the Ready loop (``_held``). False if it took
        none (the caller kicks the Ready loop)."""
        if self._turning or self._held is not None or self._stopped or \
                self.fatal is not None or self._write_s > INLINE_WRITE_S or \
                len(self._to_apply) > MAX_APPLY_BACKLOG:
            return False
        self._active()
        self._note_role(core)
        rd = core.ready()
        self.readies += 1
        if rd.snapshot is not None or not self._write_inline(rd):
            self._held = rd
            self._kick.set()
            return True
        self._turning = True  # what this calls back into (an apply's answers) waits
        try:
            self._handle_inline(rd)
            core.advance(rd)
            self._hand_over(rd.committed, at_once=True)
        except Exception as exc:  # a replica that cannot persist stops
            self._die(exc)
            return True
        finally:
            self._turning = False
        if self.fatal is None:  # (else the apply failed: ``_die``)
            if rd.entries and self._proposals and core.is_leader():
                self._prepare_ahead(rd.entries)
            self._advanced(core, rd)
        return True

    def _advanced(self, core: RaftNode, rd: Ready) -> None:
        """After a Ready taken outside the Ready loop's turn was advanced: the reads it
        serves, the role it changed, and the loop kicked for what is left."""
        if rd.read_states or self._reads.out or self._reads.waiting:
            self._serve_reads(rd.read_states)
        self._note_role(core)
        if self._catching_up:
            self._note_catch_up(core)
        if core.has_ready() or self._snapshot_due(core):
            self._kick.set()  # the Ready loop takes the rest, and the snapshot

    def _note_role(self, core: RaftNode) -> None:
        """Proposals are answered once this replica stops leading, however it stopped. A
        leader cut off from its group stands down on a tick (check-quorum) that changes no
        hard state and sends nothing: no Ready marks it, and its proposals used to wait out
        the engine's 10 s (the chaos suite's partition-leader: calls held 5-10 s at the
        deposed leader while a new one served)."""
        leads = core.is_leader()
        if self._led and not leads:
            self._lost_leadership()
        elif leads and not self._led:
            self.write_sets.wake()  # a new leader's applier waits for no one's write sets
        self._led = leads

    async def _handle(self, rd: Ready, inline: bool | None = None) -> None:
        """Install, persist, send: what must be done before the core may ``advance``.
        ``inline``: ``_write_inline(rd)``, when the caller has worked it out already."""
        if inline is None:
            inline = self._write_inline(rd)
        if rd.snapshot is not None:
            await self._snapshot_done()  # its own, taken from the state about to be replaced
            await self._applied_all()  # the state machine is swapped: nothing may apply to it
            await asyncio.to_thread(self._install, rd.snapshot)
            self._applied = max(self._applied, rd.snapshot.index)
        if inline:
            self._handle_inline(rd)
            return
        rest, writes = self._before_write(rd, False)
        took = None
        if writes:
            took = await self.writes.run(functools.partial(self._persist, rd.entries,
                                                           rd.hard_state))
        self._after_write(rd, rest, writes, took)

    def _handle_inline(self, rd: Ready) -> None:
        """``_handle`` of a Ready whose write runs on the event loop (its snapshot, if any,
        installed already)."""
        rest, writes = self._before_write(rd, True)
        took = self._persist(rd.entries, rd.hard_state) if writes else None
        self._after_write(rd, rest, writes, took)

    def _before_write(self, rd: Ready, inline: bool) -> tuple[Sequence[Message], bool]:
        """What goes before the Ready's write: a leader's appends (``_send_early``). The
        messages left to send after it, and whether there is a write."""
        hs = rd.hard_state
        changes_vote = hs is not None and (hs.term, hs.vote) != self._term_vote
        rest = self._send_early(rd, changes_vote)
        # A Ready that only moves the commit index writes nothing (the storage keeps the
        # commit only along with a new term or vote): no worker thread, no sync.
        writes = bool(rd.entries) or changes_vote
        if writes:
            self.persists += 1
            if rest is not rd.messages:  # a leader's appends went out early
                if (inline or self._proposals) and self.transport is not None:
                    self.transport.flush_now()  # they leave before the loop blocks or works
                if self._proposals:
                    # Its entry's apply worked out now, beside the followers' writes and
                    # before its own: after its own write, an answer that came meanwhile
                    # waited for it (a lone send: 0.2 ms on the commit's path here).
                    self._prepare_ahead(rd.entries)
        return rest, writes

    def _after_write(self, rd: Ready, rest: Sequence[Message], writes: bool,
                     took: float | None) -> None:
        """What goes once the Ready's write is durable (``took`` seconds; None: none)."""
        if took is not None:
            self._write_s += (took - self._write_s) / 8
            if self.on_sync is not None:
                self.on_sync(took)
        if rd.hard_state is not None:
            self._term_vote = (rd.hard_state.term, rd.hard_state.vote)
        for m in rest:
            self._send(m)
        if rest and rd.role is not Role.LEADER and writes and self.transport is not None:
            # A follower's answers that waited for its disk leave now, not at the end of the
            # loop's turn: the leader's commit waits for them, and what this turn still does
            # (the advance, the applies handed over, other shards' Readys and their fsyncs)
            # does not need to go first.
            self.transport.flush_now()

    def _writes(self, rd: Ready) -> bool:
        """Whether this Ready writes the disk (its entries, or a new term or vote)."""
        return bool(rd.entries) or (rd.hard_state is not None and (
            rd.hard_state.term, rd.hard_state.vote) != self._term_vote)

    def _write_inline(self, rd: Ready) -> bool:
        """Whether to write this Ready on the event loop rather than in a worker thread: a
        small write on a fast disk, by a follower, or by a leader with nothing else under
        way. A worker thread's round trip (two wake-ups across threads, the GIL handed back
        and forth) costs a node more CPU than a fast fsync keeps its loop waiting; on a lone
        send's path it was a third of a millisecond from the Ready to the worker's fsync,
        and as much again before the loop saw it done. A follower's answers wait for the
        write either way. A leader's appends leave before it (``_send_early``); but a leader
        with committed entries to apply, or other entries out (a busy leader: the proposer
        sends a second entry only when commands pile up), has work for its loop while a
        worker writes. A slow disk (the recent writes' average past ``INLINE_WRITE_S``)
        would stall every shard of the node."""
        if self._write_s > INLINE_WRITE_S or \
                sum(len(e.data) for e in rd.entries) > INLINE_WRITE_BYTES:
            return False
        return rd.role is not Role.LEADER or (
            not rd.committed and len(self._proposals) <= len(rd.entries))

    def _persist(self, entries: Sequence[Entry], hs: HardState | None) -> float:
        """Write and sync; the seconds it took (on the loop or in a worker thread)."""
        started = time.monotonic()
        self.storage.persist(entries, hs)
        return time.monotonic() - started

    def _send_early(self, rd: Ready, changes_vote: bool) -> Sequence[Message]:
        """A leader's appends go out before its own entries are durable: the leader writes
        its disk while the followers write theirs (Raft thesis 10.2.1), one fsync off a
        send's path. Safe because the leader counts itself for a commit only once its own
        write is done (``advance``), and its term and vote were durable before it could be
        elected; a Ready that changes them sends nothing early. What answers a peer (votes,
        append responses) waits for the disk, as the Ready contract says. Returns the
        messages left to send once the Ready is durable."""
        if rd.role is not Role.LEADER or not rd.entries or changes_vote:
            return rd.messages
        rest = []
        for m in rd.messages:
            if m.type in _EARLY:
                self._send(m)
            else:
                rest.append(m)
        return rest

    def _note_catch_up(self, core: RaftNode) -> None:
        if self._catch_up_to is None:
            if core.lead is not None and core.log.commit > 0:
                self._catch_up_to = core.log.commit  # the group's commit, as first heard
            return
        if self._applied >= self._catch_up_to:
            self._catching_up = False
            log.info("shard %d replica %s caught up to %d", self.shard_id, self.id,
                     self._catch_up_to)

    def _lost_leadership(self) -> None:
        for _, done in self._proposals.values():
            done(Proposal.UNKNOWN, None)
        self._proposals.clear()
        for _, cb in self._conf_waiters.values():
            cb(False)
        self._conf_waiters.clear()

    def _send(self, m: Message) -> None:
        if self.transport is None:
            return  # a group of one has no one to send to
        found = self._node_of.get(m.to)
        if found is None:
            if len(self._node_of) > 64:
                self._node_of.clear()  # members come and go: keep only the recent ones
            found = self._node_of[m.to] = node_of(m.to, self.shard_id)
        node, address = found
        if m.type is not MsgType.SNAPSHOT:
            self.transport.send(node, address, self.shard_id, m)
            return
        latest = self.storage.latest_snapshot()
        if latest is None:
            self.core.snapshot_failed(m.to)  # type: ignore[union-attr]
            return
        meta, path = latest
        # The newest durable snapshot goes, which may be newer than the one the core named.
        sent = self.transport.send_snapshot(node, address, self.shard_id,
                                            dataclasses.replace(m, snapshot=meta), path)

        def settled(fut: asyncio.Future[bool]) -> None:
            if not fut.result() and self.core is not None:
                self.core.snapshot_failed(m.to)
                self._kick.set()

        sent.add_done_callback(settled)
