"""One shard replica on sqsq's own Raft (``sqsq.raft``), hosted on the node's event loop.

The pure core decides; this host does what each ``Ready`` says: install a snapshot
(durably), persist entries and hard state (fsync), send messages, apply committed entries,
answer the proposals they carry. Two steps overlap where Raft allows it: committed entries
that are already durable here are applied while the Ready's new entries are being fsynced
(an applier task takes them in order), and a leader sends its appends while it writes its own
copy (it counts itself only once that is durable). Disk and large RocksDB batches run in
worker threads; the core is only ever touched on the event loop, and it goes on taking
messages and ticks while a ``Ready`` is being written (the next one waits for this one's
``advance``).

One ``PeerTransport`` per node carries every shard's messages. A member of a group is named
by its Raft address as the partition map knows it (``host:port``, the node's Raft port plus
the shard id); the node behind it listens on ``port - shard``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from sqsq.raft import (
    ConfChange,
    ConfOp,
    ConfState,
    Entry,
    EntryKind,
    Message,
    MsgType,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    SnapshotMeta,
    bootstrap,
)
from sqsq.shard.peers import PeerTransport
from sqsq.shard.raftstorage import RaftStorage
from sqsq.shard.reads import Confirmed, ReadIndexReads
from sqsq.shard.statemachine import ShardMachine

log = logging.getLogger("sqsq.raft")


class Proposal(enum.Enum):
    COMMITTED = "committed"
    NOT_LEADER = "not leader"
    UNKNOWN = "outcome unknown"  # may or may not be committed: the caller must retry


Done = Callable[[Proposal, Any], None]

# Committed entries waiting for the applier past which the Ready loop waits for it (so a
# state machine slower than the disk does not let them pile up without bound).
MAX_APPLY_BACKLOG = 1024
# A batch of committed entries this small is applied on the event loop: a worker thread's
# round trip (two wake-ups across threads, the GIL handed back and forth) costs more than
# applying a few small commands, and the loop would mostly wait for it anyway.
INLINE_APPLY_BYTES = 4096
# What a leader may send before its own write of the same Ready is durable (``_sent_early``).
_EARLY = frozenset({MsgType.APPEND, MsgType.HEARTBEAT})


MEMBER_FILE = "member"  # a replica with this file votes from its first start (a restore)


@dataclass(frozen=True)
class HostSettings:
    tick_s: float = 0.05
    election_ticks: int = 10  # with the random part: 0.5-1.0 s without a leader's word
    heartbeat_ticks: int = 2
    compaction_entries: int = 5000  # a snapshot after this many applied entries
    keep_entries: int = 500  # kept behind a snapshot for followers a little behind
    durable: bool = True
    # An idle group goes quiet after this many ticks (0: never); its followers then wake
    # only when the leader's node falls silent for ``liveness_s`` (``Liveness``).
    quiesce_after_ticks: int = 0
    liveness_s: float = 1.0


def node_of(member: str, shard_id: int) -> tuple[str, tuple[str, int]]:
    """The node (its id and its transport's address) behind a group member's address."""
    host, _, port = member.rpartition(":")
    base = int(port) - shard_id
    return f"{host}:{base}", (host, base)


class RaftReplica:
    def __init__(self, shard_id: int, member_id: str, directory: Path, machine: ShardMachine,
                 transport: PeerTransport | None, *, voters: Sequence[str], bootstrap: bool,
                 settings: HostSettings = HostSettings(),
                 on_fatal: Callable[[BaseException], None] | None = None,
                 heard: Callable[[str], float | None] | None = None,
                 ticked_by_host: bool = False) -> None:
        """``heard(node)``: when anything last came from that node (monotonic seconds), for
        a quiet follower to tell a dead leader's node from an idle one. ``ticked_by_host``:
        the process calls ``tick`` for all its replicas (one timer, not one per shard)."""
        self.shard_id = shard_id
        self.id = member_id
        self.directory = directory
        self.machine = machine
        self.transport = transport
        self.voters = tuple(voters)
        self.bootstrap = bootstrap
        self.settings = settings
        self.on_fatal = on_fatal
        self.heard = heard
        self.ticked_by_host = ticked_by_host
        self.fatal: BaseException | None = None
        self.storage = RaftStorage(directory / "raft", durable=settings.durable)
        self.on_sync: Callable[[float], None] | None = None  # seconds per persisted Ready
        self.core: RaftNode | None = None
        self._proposals: dict[int, tuple[int, Done]] = {}  # index -> (term, callback)
        self._led = False  # whether the core led when the Ready loop last looked
        self._conf_waiters: dict[int, tuple[int, Callable[[bool], None]]] = {}
        self._staged: dict[tuple[int, int], Path] = {}  # snapshots received, by index/term
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._stopped = False
        self.snapshots_written = 0
        self.snapshot_bytes = 0
        self._catching_up = False
        self._to_apply: list[Entry] = []  # committed, handed to the applier, not yet applied
        self._applier: asyncio.Task | None = None
        self._applied = 0  # what the state machine applied (the core's ``applied`` is ahead)
        self._term_vote: tuple[int, str | None] = (0, None)  # as last persisted
        self._reads = ReadIndexReads()
        self._watch: tuple[Any, str | None, bool, tuple[str, ...]] | None = None
        self._nodes: tuple[Any, frozenset[tuple[str, tuple[str, int]]]] | None = None

    # ---- life ----------------------------------------------------------------------------

    async def start(self) -> None:
        hs, meta, entries = await asyncio.to_thread(self.storage.load)
        new = meta is None and not entries and hs.term == 0
        forms_group = self.bootstrap or (self.directory / MEMBER_FILE).exists()
        if new and forms_group:
            hs, _, entries = bootstrap(frozenset(self.voters))
            await asyncio.to_thread(self.storage.persist, entries, hs)
        elif meta is not None and meta.index > self.machine.applied_index:
            await asyncio.to_thread(self._restore_state, meta)  # a crash cut an install
        # A new replica joining a group starts empty: the leader's log or snapshot tells it
        # who the members are.
        snap = meta if meta is not None else SnapshotMeta(0, 0, ConfState(frozenset()))
        self.core = RaftNode(
            self.id, hard_state=hs, snapshot=snap, entries=entries,
            applied=self.machine.applied_index, rng=random.Random(),
            config=RaftConfig(election_ticks=self.settings.election_ticks,
                              heartbeat_ticks=self.settings.heartbeat_ticks,
                              quiesce_after_ticks=self.settings.quiesce_after_ticks
                              if self.heard is not None or self.transport is None else 0),
            wiped=new and not forms_group)
        self._last_snapshot = snap.index
        self._applied = self.core.applied
        self._term_vote = (hs.term, hs.vote)
        # A wiped replica says when it holds what the group had committed when it came back.
        self._catching_up = new and not forms_group
        self._catch_up_to: int | None = None
        self._tasks = [asyncio.create_task(self._run(), name=f"raft-{self.shard_id}")]
        if not self.ticked_by_host:
            self._tasks.append(asyncio.create_task(self._ticker(),
                                                   name=f"tick-{self.shard_id}"))
        self._kick.set()

    async def stop(self) -> None:
        self._stopped = True
        tasks = [*self._tasks, *([self._applier] if self._applier is not None else [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _, done in self._proposals.values():
            done(Proposal.UNKNOWN, None)
        self._proposals.clear()
        self._reads.fail_all()
        await asyncio.to_thread(self.storage.close)

    def _die(self, exc: BaseException) -> None:
        """A replica that cannot persist or apply stops: skipping or retrying a broken apply
        would let it diverge. Without a handler the process exits."""
        self.fatal = exc
        log.critical("shard %d replica %s stopped: %r", self.shard_id, self.id, exc)
        if self.on_fatal is None:
            os._exit(70)
        self.on_fatal(exc)

    # ---- inputs --------------------------------------------------------------------------

    def step(self, message: Message) -> None:
        if self.core is not None and self.fatal is None:
            self.core.step(message)
            self._kick.set()

    def nodes(self) -> frozenset[tuple[str, tuple[str, int]]]:
        """The other members' nodes (id, address): whom the node's heartbeat goes to.
        Worked out once per membership (the node asks five times a second)."""
        conf = None if self.core is None else self.core.log.conf()
        if self._nodes is None or self._nodes[0] is not conf:
            self._nodes = (conf, frozenset(
                node_of(m, self.shard_id) for m in self.members() - {self.id}))
        return self._nodes[1]

    def on_snapshot(self, message: Message, path: Path) -> None:
        """A snapshot arrived whole and durable: the core decides whether to install it."""
        meta = message.snapshot
        if meta is None or self.core is None:
            return
        self._staged[(meta.index, meta.term)] = path
        self.step(message)

    def propose(self, data: bytes, done: Done) -> None:
        """Append ``data`` as one entry; ``done(status, outcomes)`` on the event loop."""
        core = self.core
        placed = None if core is None or self.fatal is not None else core.propose(data)
        if placed is None:
            done(Proposal.NOT_LEADER, None)
            return
        term, index = placed
        self._proposals[index] = (term, done)
        self._kick.set()

    def change_member(self, add: str | None, remove: str | None,
                      done: Callable[[bool], None]) -> None:
        """One member added (as a learner, promoted once caught up) or removed; ``done(ok)``
        once the change is applied here."""
        core = self.core
        if core is None or not core.is_leader():
            done(False)
            return
        if add is not None and add in core.log.conf().learners:
            self._promote(add, done)  # added before, never promoted (its catch-up outlasted
            return                    # the tries, or the leader that added it changed)
        if add is not None:
            placed = core.propose_conf_change(ConfChange(ConfOp.ADD_LEARNER, add))
            if placed is not None:
                self._conf_waiters[placed[1]] = (placed[0], lambda ok: self._promote(
                    add, done) if ok else done(False))
        else:
            placed = core.propose_conf_change(ConfChange(ConfOp.REMOVE, remove or ""))
            if placed is not None:
                self._conf_waiters[placed[1]] = (placed[0], done)
        if placed is None:
            done(False)
        self._kick.set()

    def _promote(self, member: str, done: Callable[[bool], None], tries: int = 200) -> None:
        core = self.core
        if core is None or not core.is_leader() or tries <= 0:
            done(False)
            return
        placed = core.propose_conf_change(ConfChange(ConfOp.PROMOTE, member))
        if placed is None:  # not caught up yet: ask again on a later tick
            asyncio.get_running_loop().call_later(
                self.settings.tick_s, self._promote, member, done, tries - 1)
            return
        self._conf_waiters[placed[1]] = (placed[0], done)
        self._kick.set()

    def transfer_leadership(self, pick: int = 0) -> None:
        """Hand leadership to a caught-up voter (the ``pick``-th of them, in address order,
        so a node handing several shards over spreads them)."""
        core = self.core
        if core is None or not core.is_leader():
            return
        last = core.log.last_index()
        ready = sorted(p for p, pr in core.progress.items()
                       if p != self.id and p in core.voters() and pr.match == last)
        if ready:
            core.transfer_leadership(ready[pick % len(ready)])
            self._kick.set()

    def read_index(self, done: Confirmed) -> None:
        """A linearizable read without a log entry (``shard.reads``): ``done(True)`` once
        this replica has confirmed with a quorum that it still leads and has applied what
        was committed when the read was asked; ``done(False)`` if it does not lead, or stops
        leading first."""
        if not self.is_leader() or self._stopped:
            done(False)
        elif self._reads.ask(done):
            asyncio.get_running_loop().call_soon(self._ask_reads)

    def _ask_reads(self) -> None:
        context, reads = self._reads.take()
        core = self.core
        if core is None or self._stopped or not self.is_leader() or \
                not core.read_index(context):
            for done in reads:
                done(False)
            return
        self._reads.sent(context, core.term, reads)
        self._kick.set()

    def _serve_reads(self, states: Sequence[Any] = ()) -> None:
        core = self.core
        if core is not None:
            self._reads.serve(states, self._applied, core.term if self.is_leader() else None)

    # ---- status --------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.fatal is None and self.core is not None and self.core.is_leader()

    def leader_address(self) -> str | None:
        return None if self.core is None else self.core.lead

    def leader_in_touch(self) -> str | None:
        core = self.core
        if core is None or core.lead is None:
            return None
        if core.is_leader() or core.election_elapsed < core.cfg.election_ticks:
            return core.lead
        return None

    @property
    def learner(self) -> bool:
        """Not voting yet: a wiped replica catching up, or a member added as a learner."""
        core = self.core
        return self._catching_up or (core is not None and self.id in core.log.conf().learners)

    def members(self) -> frozenset[str]:
        core = self.core
        return frozenset() if core is None else core.log.conf().members() | {self.id}

    def learners(self) -> frozenset[str]:
        """Members that receive the log but do not vote (yet), as this replica's log has it."""
        core = self.core
        return frozenset() if core is None else core.log.conf().learners

    @property
    def raftCurrentTerm(self) -> int:  # noqa: N802 (the name the engine and metrics read)
        return 0 if self.core is None else self.core.term

    @property
    def raftCommitIndex(self) -> int:  # noqa: N802
        return 0 if self.core is None else self.core.log.commit

    @property
    def raftLastApplied(self) -> int:  # noqa: N802
        return self._applied

    def behind(self) -> int:
        return 0 if self.core is None else self.core.log.commit - self._applied

    # ---- the Ready loop ------------------------------------------------------------------

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.settings.tick_s)
            self.tick()

    def tick(self) -> None:
        """One tick of the Raft clock. A quiet group does nothing, unless this replica
        follows a leader whose node has gone silent: then it wakes and counts again."""
        core = self.core
        if core is None or self.fatal is not None or self._stopped:
            return
        if self._reads.out:
            self._serve_reads()  # reads the core dropped with its leadership are answered
        if core.quiesced:
            leading = core.is_leader()
            if not self._watched_silent(core, leading):
                return
            # leading: a member's node fell silent, check the quorum again; following: the
            # leader's node did, its lease counts as run out
            core.wake(leader_silent=not leading)
        core.tick()
        self._kick.set()

    def _watched_silent(self, core: RaftNode, leading: bool) -> bool:
        """Whether a node this quiet replica watches fell silent: its followers' nodes when
        it leads, its leader's when it follows (no leader known counts as silent). The nodes
        are worked out once per membership and leader, not on every tick: a node ticks
        every replica it hosts twenty times a second."""
        conf, lead = core.log.conf(), core.lead
        watch = self._watch
        if watch is None or watch[0] is not conf or watch[1] != lead or watch[2] != leading:
            members = sorted(core.voters() - {self.id}) if leading else [lead] if lead else []
            watch = self._watch = (conf, lead, leading,
                                   tuple(node_of(m, self.shard_id)[0] for m in members))
        if not (leading or lead):
            return True
        if self.heard is None:
            return bool(watch[3])
        now = time.monotonic()
        for node in watch[3]:
            heard = self.heard(node)
            if heard is None or now - heard > self.settings.liveness_s:
                return True
        return False

    async def _run(self) -> None:
        """Each Ready's writes, then its messages. Its committed entries go to the applier
        (``_apply_all``): those already durable here at once, so they are applied while this
        Ready's entries are being persisted (the fsync of the next batch overlaps the apply
        of the last); those among this Ready's own entries once they are durable. The core
        counts an entry applied once it is handed over (it hands each out once); what the
        state machine really applied is ``raftLastApplied``."""
        core = self.core
        assert core is not None
        while not self._stopped:
            await self._kick.wait()
            self._kick.clear()
            self._note_role(core)
            while core.has_ready() and self.fatal is None:
                rd = core.ready()
                later = rd.committed
                if rd.snapshot is None and rd.committed:
                    new = rd.entries[0].index if rd.entries else rd.committed[-1].index + 1
                    cut = sum(1 for e in rd.committed if e.index < new)
                    self._hand_over(rd.committed[:cut])
                    later = rd.committed[cut:]
                try:
                    await self._handle(rd)
                except Exception as exc:  # a replica that cannot persist or apply stops
                    self._die(exc)
                    return
                core.advance(rd)
                self._hand_over(later)
                if len(self._to_apply) > MAX_APPLY_BACKLOG:
                    await self._applied_all()  # the disk outruns the state machine
                self._serve_reads(rd.read_states)
                self._note_role(core)
                if self._catching_up:
                    self._note_catch_up(core)
                await self._maybe_snapshot()

    def _hand_over(self, committed: Sequence[Entry]) -> None:
        if not committed or self.fatal is not None:
            return
        self._to_apply.extend(committed)
        if self._applier is None or self._applier.done():
            self._applier = asyncio.create_task(self._apply_all(),
                                                name=f"apply-{self.shard_id}")

    def _note_role(self, core: RaftNode) -> None:
        """Proposals are answered once this replica stops leading, however it stopped. A
        leader cut off from its group stands down on a tick (check-quorum) that changes no
        hard state and sends nothing: no Ready marks it, and its proposals used to wait out
        the engine's 10 s (the chaos suite's partition-leader: calls held 5-10 s at the
        deposed leader while a new one served)."""
        if self._led and not core.is_leader():
            self._lost_leadership()
        self._led = core.is_leader()

    async def _handle(self, rd: Ready) -> None:
        """Install, persist, send: what must be done before the core may ``advance``."""
        if rd.snapshot is not None:
            await self._applied_all()  # the state machine is swapped: nothing may apply to it
            await asyncio.to_thread(self._install, rd.snapshot)
            self._applied = max(self._applied, rd.snapshot.index)
        hs = rd.hard_state
        changes_vote = hs is not None and (hs.term, hs.vote) != self._term_vote
        rest = self._send_early(rd, changes_vote)
        # A Ready that only moves the commit index writes nothing (the storage keeps the
        # commit only along with a new term or vote): no worker thread, no sync.
        if rd.entries or changes_vote:
            started = time.monotonic()
            await asyncio.to_thread(self.storage.persist, rd.entries, hs)
            if self.on_sync is not None:
                self.on_sync(time.monotonic() - started)
        if hs is not None:
            self._term_vote = (hs.term, hs.vote)
        for m in rest:
            self._send(m)

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

    async def _apply_all(self) -> None:
        """Apply what was handed over, oldest first, a batch per worker-thread call; answer
        the proposals as their entries are applied."""
        while self._to_apply and self.fatal is None and not self._stopped:
            batch, self._to_apply = self._to_apply, []
            try:
                if sum(len(e.data) for e in batch) <= INLINE_APPLY_BYTES:
                    results = self._apply_batch(batch)
                else:
                    results = await asyncio.to_thread(self._apply_batch, batch)
            except Exception as exc:  # a replica that cannot apply stops
                self._die(exc)
                return
            self._applied = max(self._applied, batch[-1].index)
            if self._reads.waiting:
                self._serve_reads()  # reads that waited for this apply
            for e in batch:
                pending = self._proposals.pop(e.index, None)
                if pending is not None:
                    term, done = pending
                    ok = term == e.term and self.core is not None and \
                        self.core.is_leader() and self.core.term == term
                    done(Proposal.COMMITTED if ok else Proposal.UNKNOWN,
                         results.get(e.index))
                waiter = self._conf_waiters.pop(e.index, None)
                if waiter is not None:
                    waiter[1](waiter[0] == e.term)
            if self._catching_up and self.core is not None:
                self._note_catch_up(self.core)

    def _apply_batch(self, batch: list[Entry]) -> dict[int, Any]:
        """The state machine's outcomes by index, for the entries that carry commands (in a
        worker thread, or on the loop for a small batch)."""
        apply = self.machine.apply_entry
        return {e.index: apply(e.index, e.data) for e in batch
                if e.kind is EntryKind.NORMAL and e.data}

    async def _applied_all(self) -> None:
        """Wait until everything handed to the applier is applied."""
        applier = self._applier
        if applier is not None and not applier.done():
            await asyncio.wait([applier])

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
        node, address = node_of(m.to, self.shard_id)
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

    # ---- snapshots -----------------------------------------------------------------------

    async def _maybe_snapshot(self) -> None:
        core = self.core
        assert core is not None
        if core.applied - self._last_snapshot < self.settings.compaction_entries:
            return
        await self._applied_all()  # the checkpoint must not race an apply
        index = self.machine.applied_index
        if index - self._last_snapshot < self.settings.compaction_entries:
            return
        if core.log.term(index) is None or index > core.log.stable or index > core.applied:
            return
        meta = core.snapshot_meta(index)
        path = await asyncio.to_thread(self.storage.save_snapshot, meta, self._write_state)
        self._last_snapshot = meta.index
        self.snapshots_written += 1
        self.snapshot_bytes = path.stat().st_size
        keep = self.settings.keep_entries
        core.compact(meta, keep)
        await asyncio.to_thread(self.storage.compact, meta.index - keep)

    def _write_state(self, f: BinaryIO) -> None:
        """The state machine's checkpoint, packed into the snapshot file (worker thread)."""
        with tempfile.TemporaryDirectory(dir=self.directory) as tmp:
            packed = Path(tmp) / "state"
            self.machine.write_snapshot(str(packed), b"")()
            with open(packed, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 20)

    def _install(self, meta: SnapshotMeta) -> None:
        """A snapshot the core accepted: durable in the Raft storage first (the log reset
        behind it), then the state machine swapped to it (worker thread)."""
        path = self._staged.pop((meta.index, meta.term))
        # Others received up to this one are superseded (the core never installs a snapshot
        # behind its commit): their files go too. Newer ones stay for the core to decide.
        for key in [k for k in list(self._staged) if k[0] <= meta.index]:
            stale = self._staged.pop(key, None)
            if stale is not None:
                stale.unlink(missing_ok=True)
        with self.storage.snapshots.open_data(path) as src:
            self.storage.install_snapshot(meta, lambda f: shutil.copyfileobj(src, f, 1 << 20))
        path.unlink(missing_ok=True)
        self._restore_state(meta)
        self._last_snapshot = meta.index

    def _restore_state(self, meta: SnapshotMeta) -> None:
        latest = self.storage.latest_snapshot()
        assert latest is not None and latest[0] == meta
        with self.storage.snapshots.open_data(latest[1]) as f:
            self.machine.install_from(f)



class Replicas:
    """A node's replicas by shard, behind its one transport: what arrives is routed here."""

    def __init__(self) -> None:
        self.by_shard: dict[int, RaftReplica] = {}

    def on_messages(self, peer: str, batch: list[tuple[int, Message]]) -> None:
        for shard_id, message in batch:
            replica = self.by_shard.get(shard_id)
            if replica is not None:
                replica.step(message)

    def on_snapshot(self, peer: str, shard_id: int, message: Message, path: Path) -> None:
        replica = self.by_shard.get(shard_id)
        if replica is None:
            path.unlink(missing_ok=True)
            return
        replica.on_snapshot(message, path)
