"""One shard replica on sqsq's own Raft (``sqsq.raft``), hosted on the node's event loop.

The pure core decides; this host feeds it (messages, ticks, proposals, reads, membership
changes) and does what each ``Ready`` says (``shard.readyloop``).

One ``PeerTransport`` per node carries every shard's messages. A member of a group is named
by its Raft address as the partition map knows it (``host:port``, the node's Raft port plus
the shard id); the node behind it listens on ``port - shard``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqsq.raft import (
    ConfChange,
    ConfOp,
    ConfState,
    Entry,
    Message,
    RaftConfig,
    RaftNode,
    SnapshotMeta,
    bootstrap,
)
from sqsq.shard import writesets
from sqsq.shard.applier import Done, Proposal
from sqsq.shard.peers import PeerTransport
from sqsq.shard.raftclock import node_of
from sqsq.shard.raftstorage import RaftStorage, Writes
from sqsq.shard.reads import Confirmed, ReadIndexReads
from sqsq.shard.readyloop import ReadyLoop
from sqsq.shard.statemachine import Prepared, ShardMachine

log = logging.getLogger("sqsq.raft")


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


class RaftReplica(ReadyLoop):
    def __init__(self, shard_id: int, member_id: str, directory: Path, machine: ShardMachine,
                 transport: PeerTransport | None, *, voters: Sequence[str], bootstrap: bool,
                 settings: HostSettings = HostSettings(),
                 on_fatal: Callable[[BaseException], None] | None = None,
                 heard: Callable[[str], float | None] | None = None,
                 ticked_by_host: bool = False, writes: Writes | None = None) -> None:
        """``heard(node)``: when anything last came from that node (monotonic seconds), for
        a quiet follower to tell a dead leader's node from an idle one. ``ticked_by_host``:
        the process calls ``tick`` for all its replicas (one timer, not one per shard).
        ``writes``: the process's batched Raft writes, shared by its replicas (default: this
        replica's own)."""
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
        self.writes = writes if writes is not None else Writes()
        self.on_sync: Callable[[float], None] | None = None  # seconds per persisted Ready
        self.on_active: Callable[[], None] | None = None  # each turn of the Ready loop
        self.core: RaftNode | None = None
        self._proposals: dict[int, tuple[int, Done]] = {}  # index -> (term, callback)
        self._led = False  # whether the core led when the Ready loop last looked
        self._conf_waiters: dict[int, tuple[int, Callable[[bool], None]]] = {}
        self._staged: dict[tuple[int, int], Path] = {}  # snapshots received, by index/term
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._stopped = False
        self.snapshots_written = 0
        self.readies = self.persists = 0  # Readys handled, and those that wrote the disk
        self._write_s = 0.0  # how long a write of a Ready took, recent ones' moving average
        self.snapshot_bytes = 0
        self._catching_up = False
        self._to_apply: list[Entry] = []  # committed, handed to the applier, not yet applied
        self._applier: asyncio.Task | None = None
        self._prepared: dict[int, Prepared] = {}  # a leader's entries applied ahead, by index
        self._apply_due = False  # a follower's ``_apply_soon`` is scheduled
        self._apply_timer: asyncio.TimerHandle | None = None  # a follower's apply waits
        self._linger_from = 0.0  # since then (``FOLLOWER_APPLY_LINGER_S``), with
        self._linger_bytes = 0  # this much entry data
        self._node_of: dict[str, tuple[str, tuple[str, int]]] = {}  # member -> node_of()
        self._applied = 0  # what the state machine applied (the core's ``applied`` is ahead)
        self._term_vote: tuple[int, str | None] = (0, None)  # as last persisted
        self._reads = ReadIndexReads()
        self.write_sets = writesets.Received()  # the leader's, while this replica follows
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
        self._end_wait()
        tasks = [*self._tasks, *([self._applier] if self._applier is not None else [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._snapshotting is not None:  # not cancelled: its worker thread would run on
            await asyncio.wait([self._snapshotting])  # against a closed store
        for _, done in self._proposals.values():
            done(Proposal.UNKNOWN, None)
        self._proposals.clear()
        self._reads.fail_all()
        # After any write still in the batch it was in (a cancelled wait does not stop it).
        await asyncio.shield(self.writes.run(self.storage.close))

    def _die(self, exc: BaseException) -> None:
        """A replica that cannot persist or apply stops: skipping or retrying a broken apply
        would let it diverge. Without a handler the process exits."""
        self.fatal = exc
        log.critical("shard %d replica %s stopped: %r", self.shard_id, self.id, exc)
        if self.on_fatal is None:
            os._exit(70)
        self.on_fatal(exc)

    # ---- inputs --------------------------------------------------------------------------

    def step(self, message: Message, settle: bool = True) -> None:
        """``settle``: act on what it leaves to do now (else the caller calls ``settle``,
        once for several messages)."""
        core = self.core
        if core is not None and self.fatal is None:
            core.step(message)
            if settle:
                self.settle()

    def settle(self) -> None:
        """Act on what the messages stepped in left to do. One that leaves nothing (an
        answer to an entry already committed, which on a lone send arrives while the leader
        applies and replies) costs no turn of the Ready loop; one that only commits, or
        whose Ready is written on the event loop (a follower's append), is acted on here
        (``_ready_now``, ``_ready_at_once``). A change of role always comes with a Ready (a
        new term, a commit, or messages to send)."""
        core = self.core
        if core is not None and self.fatal is None and core.has_ready() and \
                not self._ready_now(core) and not self._ready_at_once(core):
            self._kick.set()

    def refused_by(self, node: str) -> None:
        """``node``'s Raft port refused a connection. If this replica's leader lives there,
        its process is gone (or restarting): stand within a tick or two rather than wait
        out an election timeout (``RaftNode.forget_leader``)."""
        core = self.core
        if core is None or self.fatal is not None or self._stopped or core.lead is None \
                or core.is_leader() or node_of(core.lead, self.shard_id)[0] != node:
            return
        core.forget_leader()
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

    def on_write_set(self, index: int, term: int, entry_check: int,
                     blob: bytes | None) -> None:
        """The leader's write set of entry ``index`` (None: not shared), kept for the applier."""
        if self.fatal is None and not self._stopped:
            self.write_sets.add(index, term, entry_check, blob, self._applied)

    def propose(self, data: bytes, done: Done) -> None:
        """Append ``data`` as one entry; ``done(status, outcomes)`` on the event loop."""
        core = self.core
        if core is None or self.fatal is not None or (placed := core.propose(data)) is None:
            done(Proposal.NOT_LEADER, None)
            return
        term, index = placed
        self._proposals[index] = (term, done)
        if not self._ready_at_once(core):
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

    def transfer_leadership(self, pick: int = 0, to: str | None = None) -> bool:
        """Hand leadership to the caught-up voter ``to``, or else to the ``pick``-th of them
        in address order (a node handing several shards over spreads them). A follower that
        stopped (its node stopped just before this one) still holds the whole log and would
        be asked in vain: those whose node has no connection open are left out, and those
        heard from in the last check-quorum round come first. False if no voter is left
        that could take over (every other one's node is gone)."""
        core = self.core
        if core is None or not core.is_leader():
            return False
        others = [p for p in core.voters() if p != self.id and self._linked(p)]
        last = core.log.last_index()
        ready = sorted(p for p in others if p in core.progress and core.progress[p].match == last)
        heard = [p for p in ready
                 if core.progress[p].recent_active or not core.progress[p].silent_rounds]
        ready = heard or ready
        if to is not None:
            ready = [to] if to in ready else []
        if ready:
            core.transfer_leadership(ready[pick % len(ready)])
            self._kick.set()
        return bool(others)

    def _linked(self, member: str) -> bool:
        """Whether ``member``'s node has a connection open (always, without a transport)."""
        transport = self.transport
        return transport is None or transport.linked(node_of(member, self.shard_id)[0])

    def near(self, member: str, slack: int) -> bool:
        """Whether ``member``, a voter whose node has a connection open, holds the log but
        for at most ``slack`` entries: it can take over within a round trip or two."""
        core = self.core
        if core is None or member not in core.voters() or member not in core.progress:
            return False
        if not self._linked(member):
            return False
        return core.progress[member].match >= core.log.last_index() - slack

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

