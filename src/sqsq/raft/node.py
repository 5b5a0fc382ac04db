"""The consensus core: one replica of one Raft group, as a state machine with no I/O.

Inputs are method calls: ``step`` (a message from a peer), ``tick`` (the host's clock moved
one tick), ``propose``, ``propose_conf_change``, ``read_index``, ``transfer_leadership`` and
``compact``. The output is a ``Ready`` (``has_ready``/``ready``/``advance``): what to persist,
what to send, what to apply. The core keeps no clock, threads, sockets or disk; its only
randomness is the ``random.Random`` the host passes, for election timeouts.

The shape is etcd's raft (RawNode and Ready); the elections are Raft's with pre-vote and
check-quorum; replication pipelines appends per follower (``progress``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqsq.raft.election import FROM_LEADER, Electing
from sqsq.raft.leader import Leading, coalesced
from sqsq.raft.log import RaftLog
from sqsq.raft.progress import Progress, ProgressState
from sqsq.raft.types import (
    QUIESCE,
    TRANSFER,
    ConfChange,
    ConfOp,
    Entry,
    EntryKind,
    HardState,
    Message,
    MsgType,
    RaftConfig,
    ReadState,
    Ready,
    Role,
    Safeguards,
    SnapshotMeta,
)

if TYPE_CHECKING:
    import random  # the host's seeded generator; the core draws nothing of its own

# Enum members as module constants: a class attribute lookup on an Enum costs several
# times a global's, and ``step`` compares a message's type a few times per message.
_APPEND, _APPEND_RESP, _HEARTBEAT = MsgType.APPEND, MsgType.APPEND_RESP, MsgType.HEARTBEAT
_SNAPSHOT, _PRE_VOTE, _PRE_VOTE_RESP = MsgType.SNAPSHOT, MsgType.PRE_VOTE, MsgType.PRE_VOTE_RESP
_VOTES = frozenset({MsgType.VOTE, MsgType.PRE_VOTE})
_LEADER, _FOLLOWER = Role.LEADER, Role.FOLLOWER
DEFAULT_CONFIG = RaftConfig()
ABSTAINED = "~abstained"  # the vote of a wiped replica in the first term it learns of
ALL_SAFEGUARDS = Safeguards()


class RaftNode(Leading, Electing):
    def __init__(self, node_id: str, *, hard_state: HardState, snapshot: SnapshotMeta,
                 entries: tuple[Entry, ...] = (), applied: int | None = None,
                 rng: random.Random, config: RaftConfig = DEFAULT_CONFIG,
                 safeguards: Safeguards = ALL_SAFEGUARDS, wiped: bool = False) -> None:
        """A replica as it restarts: its durable hard state, its last snapshot's metadata
        (index 0 and no members for a replica that will learn them from the leader) and the
        entries after it. ``applied``: how far the host's state machine is (default: the
        snapshot). ``wiped``: the replica lost its disk (a new directory for a member that
        is not forming a new group); it may have voted before in the term it is about to
        learn of, so it casts no vote in that term."""
        self.id = node_id
        self.cfg = config
        self.guard = safeguards
        self.rng = rng
        self.log = RaftLog(snapshot, entries, hard_state.commit)
        self.term = hard_state.term
        self.vote = hard_state.vote
        self.applied = snapshot.index if applied is None else max(applied, snapshot.index)
        # What the state machine applied was committed, whatever the hard state kept.
        self.log.commit_to(min(self.applied, self.log.last_index()))
        self.role = Role.FOLLOWER
        self.lead: str | None = None
        self.msgs: list[Message] = []
        self.read_states: list[ReadState] = []
        self.progress: dict[str, Progress] = {}
        self.votes: dict[str, bool] = {}
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.timeout = 0
        self.transferee: str | None = None
        self.pending_reads: list[tuple[bytes, int, set[str]]] = []  # (context, index, acks)
        self.waiting_reads: list[bytes] = []  # asked before this term's first commit
        self.quiesced = False
        self.idle_ticks = 0
        self._persisted = hard_state
        self._out = False  # a Ready handed out and not yet advanced
        self._abstain = wiped and hard_state.term == 0
        self._reset_timeout()

    # ---- the host's view -------------------------------------------------------------------

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.commit)

    def is_leader(self) -> bool:
        return self.role is _LEADER

    def voters(self) -> frozenset[str]:
        return self.log.conf().voters

    def has_ready(self) -> bool:
        # Asked after every message a host steps in: compared field by field, no HardState
        # built. (The commit never passes the log's last index: ``commit_to`` refuses it.)
        log, p = self.log, self._persisted
        return bool(self.msgs or self.read_states or log.unstable_from is not None
                    or log.pending_snapshot is not None
                    or self.term != p.term or self.vote != p.vote or log.commit != p.commit
                    or self.applied < log.commit)

    def commit_only(self) -> bool:
        """Whether the next Ready would only commit (hand out committed entries, move the
        commit index): no entries to persist, no message, no read state, no snapshot, term
        and vote as persisted, and no Ready handed out and not yet advanced. Then every
        entry in the log is durable here, those committed included, and a host may act on
        that Ready at once: there is nothing to write or send before it applies them."""
        log, p = self.log, self._persisted
        return not (self._out or self.msgs or self.read_states
                    or log.unstable_from is not None or log.pending_snapshot is not None
                    or self.term != p.term or self.vote != p.vote)

    def ready(self) -> Ready:
        """What to do next. The core may be stepped and ticked while the host works on it
        (persisting takes a while); call ``advance`` with it before asking again."""
        log, p = self.log, self._persisted
        term, vote, commit = self.term, self.vote, log.commit
        snapshot, log.pending_snapshot = log.pending_snapshot, None
        msgs, reads = self.msgs, self.read_states
        rd = Ready(
            None if term == p.term and vote == p.vote and commit == p.commit
            else HardState(term, vote, commit),
            log.take_unstable(),
            snapshot,
            coalesced(msgs, self.cfg.max_append_bytes) if msgs else (),
            self._committed(),
            tuple(reads) if reads else (),
            self.lead,
            self.role,
        )
        if msgs:
            self.msgs = []
        if reads:
            self.read_states = []
        self._out = True
        return rd

    def _committed(self) -> tuple[Entry, ...]:
        log = self.log
        lo = max(self.applied, log.snap.index) + 1
        hi = min(log.commit, log.last_index())
        return log.between(lo, hi) if hi >= lo else ()

    def advance(self, rd: Ready) -> None:
        """The host did what ``rd`` asked: entries and hard state are durable, the snapshot
        installed, the committed entries applied."""
        self._out = False
        if rd.hard_state is not None:
            self._persisted = rd.hard_state
        if rd.snapshot is not None:
            self.applied = max(self.applied, rd.snapshot.index)
        if rd.entries:
            self.log.stable_to(rd.entries[-1].index, rd.entries[-1].term)
        if rd.committed:
            self.applied = max(self.applied, rd.committed[-1].index)
        if self.role is _LEADER:
            # A leader counts its own entries only once they are durable on its own disk.
            # The commit this finds goes with the next append or tick (``_send_commit``).
            # Only a longer durable copy here can move it: every other match that moves
            # (``_handle_append_resp``) looks for a commit itself.
            own = self.progress.get(self.id)
            if own is not None and own.maybe_update(self.log.stable):
                self._maybe_commit()

    # ---- inputs ----------------------------------------------------------------------------

    def tick(self) -> None:
        if self.quiesced:
            return  # asleep: no heartbeats, no election countdown, until woken
        self.election_elapsed += 1
        if self.role is _LEADER:
            self._tick_leader()
        elif self._promotable() and self.election_elapsed >= self.timeout:
            self.election_elapsed = 0
            self._campaign(pre=self.cfg.pre_vote, transfer=False)

    def wake(self, leader_silent: bool = False) -> None:
        """Leave quiescence: the host saw work, or (``leader_silent``) stopped hearing from
        the leader's node, whose lease then counts as run out. A woken leader heartbeats at
        once; a woken follower counts towards an election."""
        if self.quiesced:
            self.quiesced = False
            self.idle_ticks = 0
            if self.role is _LEADER:
                self._broadcast_heartbeat(b"")
            elif leader_silent:
                self.election_elapsed = max(self.election_elapsed, self.cfg.election_ticks)

    def propose(self, data: bytes) -> tuple[int, int] | None:
        """Append ``data`` if this node leads; its (term, index), or None (not leading, or
        handing leadership over). The entry is the host's once it is applied at that index
        with that term."""
        self.wake()
        if self.role is not _LEADER or self.transferee is not None:
            return None
        return self._append_own(data, EntryKind.NORMAL)

    def propose_conf_change(self, change: ConfChange) -> tuple[int, int] | None:
        """One membership change; None if this node does not lead, one is still uncommitted,
        this term has committed nothing yet, or the change makes no sense here."""
        self.wake()
        if self.role is not _LEADER or self.transferee is not None:
            return None
        if self.guard.one_conf_change_at_a_time and (
                self.log.last_conf_index() > self.log.commit or not self._committed_in_term()):
            return None
        conf = self.log.conf()
        if change.op is ConfOp.ADD_LEARNER and change.node in conf.members():
            return None
        if change.op is ConfOp.PROMOTE:
            pr = self.progress.get(change.node)
            # A learner votes only once it holds everything committed.
            if change.node not in conf.learners or pr is None or pr.match < self.log.commit:
                return None
        if change.op is ConfOp.REMOVE and (change.node not in conf.members()
                                           or conf.voters == {change.node}):
            return None
        return self._append_own(change.encode(), EntryKind.CONF)

    def read_index(self, context: bytes) -> bool:
        """Ask for a linearizable read: a ReadState with ``context`` comes out once this
        leader has confirmed it still leads; False if it does not lead."""
        if self.quiesced and self.role is _LEADER:
            # Woken for this read's round only: it leaves nothing to catch up, so the idle
            # count goes on and the group is quiet again on the next round. (A receive's
            # look at an idle partition kept its group heartbeating for 2 s.) The read's
            # own heartbeats wake the followers.
            self.quiesced = False
        else:
            self.wake()
        if self.role is not _LEADER:
            return False
        if not self._committed_in_term():
            self.waiting_reads.append(context)  # the commit index is not known to be current
            return True
        self._start_read(context)
        return True

    def transfer_leadership(self, target: str) -> bool:
        if (self.role is not _LEADER or target == self.id or target not in self.voters()
                or target not in self.progress):
            return False
        self.transferee = target
        self.election_elapsed = 0  # a transfer that takes an election timeout is given up
        if self.progress[target].match == self.log.last_index():
            self._send(target, MsgType.TIMEOUT_NOW)
        else:
            self._send_append(target)
        return True

    def snapshot_meta(self, index: int) -> SnapshotMeta:
        """The metadata to store with a snapshot of the state at ``index`` (applied)."""
        self.wake()
        if index > self.applied:
            raise ValueError(f"no snapshot at {index}: applied only {self.applied}")
        return self.log.meta_at(index)

    def compact(self, snapshot: SnapshotMeta, keep: int = 0) -> None:
        """The host holds ``snapshot`` durably: drop the entries it covers but the last
        ``keep``. Followers further behind are sent that snapshot."""
        self.log.compact(snapshot, keep)

    def snapshot_failed(self, peer: str) -> None:
        """The host could not deliver the snapshot to ``peer``: probe again."""
        pr = self.progress.get(peer)
        if pr is not None and pr.state is ProgressState.SNAPSHOT:
            pr.become_probe()

    def step(self, m: Message) -> None:
        if self.quiesced and m.context != QUIESCE:
            self.wake()  # anything but the quiet round itself is a sign of life
        kind = m.type
        if m.term > self.term:
            if kind in _VOTES and m.context != TRANSFER and (
                    self.cfg.check_quorum and self.lead is not None
                    and self.election_elapsed < self.cfg.election_ticks):
                return  # a leader was heard within the timeout: no vote, no new term (lease)
            if kind is _PRE_VOTE or (kind is _PRE_VOTE_RESP and not m.reject):
                pass  # a pre-vote changes nobody's term
            else:
                self._become_follower(m.term, m.frm if kind in FROM_LEADER else None)
        elif m.term < self.term:
            if not self.guard.stale_responses_ignored and kind is _APPEND_RESP:
                pass  # mutant: a stale acknowledgement is counted as if it were current
            else:
                if (self.cfg.check_quorum or self.cfg.pre_vote) and kind in FROM_LEADER:
                    # A deposed leader learns of the new term (it would not otherwise).
                    self._send(m.frm, _APPEND_RESP)
                elif kind is _PRE_VOTE:
                    self._send(m.frm, _PRE_VOTE_RESP, reject=True)
                return
        if kind in _VOTES:
            self._handle_vote(m)
        elif self.role is _LEADER:
            self._step_leader(m)
        elif self.role is _FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    # ---- roles -----------------------------------------------------------------------------

    def _reset(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = None
            if self._abstain:  # the first term a wiped replica learns of: no vote in it
                self.vote, self._abstain = ABSTAINED, False
        self.lead = None
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self._reset_timeout()
        self.votes = {}
        self.transferee = None
        self.pending_reads = []
        self.waiting_reads = []
        self.quiesced = False
        self.idle_ticks = 0

    def _become_follower(self, term: int, lead: str | None) -> None:
        self._reset(term)
        self.role = _FOLLOWER
        self.lead = lead

    def _become_leader(self) -> None:
        self._reset(self.term)
        self.role = _LEADER
        self.lead = self.id
        last = self.log.last_index()
        self.progress = {}
        for peer in sorted(self.log.conf().members() | {self.id}):  # a seed replays
            self.progress[peer] = Progress(last + 1, self.cfg.max_inflight)
        self.progress[self.id].match = self.log.stable
        self.progress[self.id].become_replicate()
        # The no-op: entries of earlier terms commit only with one of this term.
        self._append_own(b"", EntryKind.NORMAL)

    def _step_follower(self, m: Message) -> None:
        kind = m.type
        if kind is _APPEND:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_append(m)
        elif kind is _HEARTBEAT:
            self.election_elapsed = 0
            self.lead = m.frm
            self.log.commit_to(min(m.commit, self.log.last_index()))
            self._send(m.frm, MsgType.HEARTBEAT_RESP, context=m.context)
            if m.context == QUIESCE:
                self.quiesced = True
        elif kind is _SNAPSHOT:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_snapshot(m)
        elif kind is MsgType.TIMEOUT_NOW and self._promotable():
            self._campaign(pre=False, transfer=True)

    def _handle_append(self, m: Message) -> None:
        log = self.log
        if m.index < log.commit:
            self._send(m.frm, _APPEND_RESP, index=log.commit)
            return
        if not log.match_term(m.index, m.log_term):
            self._send(m.frm, _APPEND_RESP, index=m.index, reject=True,
                       hint=log.last_index())
            return
        entries = m.entries
        last_new = m.index + len(entries)
        if self.guard.truncate_only_at_conflict:
            conflict = log.find_conflict(entries)
            if conflict:
                log.append(entries[conflict - entries[0].index :])
        elif entries:
            log.append(entries)  # mutant: whatever followed prev goes, held or not
        log.commit_to(min(m.commit, last_new))
        # the answer, built positionally (keyword arguments cost a dict per message)
        self.msgs.append(Message(_APPEND_RESP, m.frm, self.id, self.term, 0, last_new))

    def _handle_snapshot(self, m: Message) -> None:
        meta = m.snapshot
        assert meta is not None
        log = self.log
        if meta.index <= log.commit and self.guard.refuse_snapshot_behind_commit:
            # Older than what this replica has committed: installing it would drop
            # acknowledged entries from the log.
            self._send(m.frm, MsgType.APPEND_RESP, index=log.commit)
            return
        if log.match_term(meta.index, meta.term) and meta.index > log.commit:
            log.commit_to(meta.index)  # the log already holds it: no need to install
            self._send(m.frm, MsgType.APPEND_RESP, index=log.commit)
            return
        log.restore(meta)
        self._send(m.frm, MsgType.APPEND_RESP, index=meta.index)

    def _send(self, to: str, kind: MsgType, **fields: object) -> None:
        self.msgs.append(Message(kind, to, self.id, self.term, **fields))  # type: ignore[arg-type]
