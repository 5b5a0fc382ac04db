"""The leader's half of the consensus core: replication to each follower (probe, pipeline,
snapshot), commitment by a majority of durable copies, heartbeats, check-quorum and
ReadIndex. ``RaftNode`` mixes it in; it is split out only to keep each file readable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqsq.raft.progress import Progress, ProgressState
from sqsq.raft.types import QUIESCE, Entry, EntryKind, Message, MsgType, ReadState, Role

if TYPE_CHECKING:
    from sqsq.raft.log import RaftLog
    from sqsq.raft.types import RaftConfig

_APPEND, _APPEND_RESP = MsgType.APPEND, MsgType.APPEND_RESP
_REPLICATE, _PROBE, _SNAPSHOT = ProgressState.REPLICATE, ProgressState.PROBE, ProgressState.SNAPSHOT


def coalesced(msgs: list[Message], max_append_bytes: int) -> tuple[Message, ...]:
    """A Ready's messages with those that say the same thing once: appends to one follower
    that continue each other (proposals made while the last Ready was written) as one
    append, up to ``max_append_bytes`` of entries; of a follower's accepting answers to the
    leader in a row, the last (it acknowledges everything the earlier ones did). Each peer
    still gets its messages in order. One message instead of several saves an encode, a
    decode, a step and, for an append, the follower's answer to each."""
    if len(msgs) < 2 or len({m.to for m in msgs}) == len(msgs):
        return tuple(msgs)  # one message per peer: nothing to merge (a set is cheaper)
    out: list[Message] = []
    last: dict[str, int] = {}  # peer -> where in ``out`` the last message to it is
    for m in msgs:
        i = last.get(m.to)
        if i is not None:
            prev = out[i]
            if (m.type is _APPEND and prev.type is _APPEND and m.entries
                    and prev.entries and m.term == prev.term
                    and m.index == prev.entries[-1].index
                    and m.log_term == prev.entries[-1].term
                    and sum(len(e.data) for e in prev.entries) + sum(
                        len(e.data) for e in m.entries) <= max_append_bytes):
                out[i] = Message(_APPEND, m.to, m.frm, m.term, prev.log_term,
                                 prev.index, prev.entries + m.entries, max(m.commit, prev.commit))
                continue
            if (m.type is _APPEND_RESP and prev.type is _APPEND_RESP
                    and not m.reject and not prev.reject and m.term == prev.term
                    and m.index >= prev.index):
                out[i] = m
                continue
        last[m.to] = len(out)
        out.append(m)
    return tuple(out)


class Leading:
    """What a leader does; the state it reads is ``RaftNode``'s."""

    id: str
    term: int
    role: Role
    cfg: RaftConfig
    log: RaftLog
    msgs: list[Message]
    read_states: list[ReadState]
    progress: dict[str, Progress]
    election_elapsed: int
    heartbeat_elapsed: int
    transferee: str | None
    pending_reads: list[tuple[bytes, int, set[str]]]
    waiting_reads: list[bytes]
    quiesced: bool
    idle_ticks: int

    def voters(self) -> frozenset[str]: ...
    def _become_follower(self, term: int, lead: str | None) -> None: ...
    def _send(self, to: str, kind: MsgType, **fields: object) -> None: ...

    def _tick_leader(self) -> None:
        self.heartbeat_elapsed += 1
        if self.election_elapsed >= self.cfg.election_ticks:
            self.election_elapsed = 0
            if self.cfg.check_quorum and not self._quorum_active():
                self._become_follower(self.term, None)  # cut off from a majority: stand down
                return
            self.transferee = None  # a transfer not done within a timeout is given up
        for peer, pr in self.progress.items():
            if pr.state is ProgressState.SNAPSHOT:
                pr.snapshot_ticks += 1
                if pr.snapshot_ticks > 2 * self.cfg.election_ticks and peer != self.id:
                    pr.become_probe()  # the snapshot or its answer was lost: try again
        if self.heartbeat_elapsed >= self.cfg.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            quiet = self._idle()
            self._broadcast_heartbeat(QUIESCE if quiet else b"", busy=not quiet)
            self.quiesced = quiet
        else:
            self._send_commit()

    def _send_commit(self) -> None:
        """Between heartbeat rounds (``heartbeat_ticks`` above 1), a commit index no append
        has carried yet goes to the followers on the tick after it moved: under load the
        next append carries it (``_maybe_commit`` sends nothing of its own). A round's tick
        leaves it to the round (``_broadcast_heartbeat``)."""
        commit = self.log.commit
        for peer, pr in self.progress.items():
            if peer != self.id and pr.commit_sent < commit:
                self._send_append(peer)

    def _idle(self) -> bool:
        """Long enough with nothing to do that the group may go quiet."""
        if not self.cfg.quiesce_after_ticks:
            return False
        last = self.log.last_index()
        if (self.transferee is not None or self.log.commit != last
                or any(pr.match != last for pr in self.progress.values())):
            self.idle_ticks = 0
            return False
        if self.pending_reads or self.waiting_reads:
            return False  # not while a read waits for its round; but it changed nothing
        self.idle_ticks += self.cfg.heartbeat_ticks
        return self.idle_ticks >= self.cfg.quiesce_after_ticks

    def _quorum_active(self) -> bool:
        """A check-quorum round: whether a majority was heard from within the last
        ``check_quorum_rounds`` rounds (this one included)."""
        for p, pr in self.progress.items():
            if p != self.id:
                pr.silent_rounds = 0 if pr.recent_active else pr.silent_rounds + 1
                pr.recent_active = False
        rounds = self.cfg.check_quorum_rounds
        voters = self.voters()
        active = sum(1 for p in voters
                     if p == self.id or (p in self.progress and
                                         self.progress[p].silent_rounds < rounds))
        return active >= len(voters) // 2 + 1

    def _append_own(self, data: bytes, kind: EntryKind) -> tuple[int, int]:
        index = self.log.last_index() + 1
        self.log.append([Entry(index, self.term, data, kind)])
        if kind is EntryKind.CONF:
            self._sync_progress()
        self._broadcast_append()
        return self.term, index

    def _sync_progress(self) -> None:
        """The membership changed: track who joined, forget who left."""
        members = self.log.conf().members() | {self.id}
        for peer in sorted(members - self.progress.keys()):
            self.progress[peer] = Progress(self.log.last_index() + 1, self.cfg.max_inflight)
        for peer in set(self.progress) - members:
            del self.progress[peer]

    def _committed_in_term(self) -> bool:
        return self.log.term(self.log.commit) == self.term

    def _maybe_commit(self) -> bool:
        voters = self.voters()
        progress = self.progress
        matches = sorted([progress[p].match for p in voters if p in progress], reverse=True)
        quorum = len(voters) // 2 + 1
        if len(matches) < quorum:
            return False
        index = matches[quorum - 1]
        # Only an entry of this term commits by counting (Raft's figure 8).
        if index > self.log.commit and self.log.term(index) == self.term:
            self.log.commit_to(index)
            self._on_commit()
            return True
        return False

    def _on_commit(self) -> None:
        if self.waiting_reads and self._committed_in_term():
            waiting, self.waiting_reads = self.waiting_reads, []
            for context in waiting:
                self._start_read(context)
        if self.id not in self.log.conf().members() and (
                self.log.last_conf_index() <= self.log.commit):
            self._become_follower(self.term, None)  # removed, and the removal is committed

    def _broadcast_append(self) -> None:
        # Followers that need the same entries share one slice of the log (and one tuple:
        # a transport may then encode it once).
        shared: dict[int, tuple[Entry, ...]] = {}
        for peer in self.progress:
            if peer != self.id:
                self._send_append(peer, True, shared)

    def _send_append(self, peer: str, send_empty: bool = True,
                     shared: dict[int, tuple[Entry, ...]] | None = None) -> bool:
        pr = self.progress[peer]
        if pr.is_paused():
            return False
        log = self.log
        nxt = pr.next
        last = log.last_index()
        if nxt > last and not send_empty:
            return False  # nothing new (and prev, at or past the snapshot, has a term)
        prev = nxt - 1
        prev_term = log.term(prev)
        if prev_term is None:
            # The follower needs entries this log has compacted: the snapshot instead.
            pr.become_snapshot(log.snapshot.index)
            self.msgs.append(Message(MsgType.SNAPSHOT, peer, self.id, self.term,
                                     snapshot=log.snapshot))
            return False
        if nxt > last:
            entries: tuple[Entry, ...] = ()
        elif shared is None:
            entries = log.slice(nxt, last, self.cfg.max_append_bytes)
        else:
            found = shared.get(nxt)
            if found is None:
                found = shared[nxt] = log.slice(nxt, last, self.cfg.max_append_bytes)
            entries = found
        commit = log.commit
        self.msgs.append(Message(_APPEND, peer, self.id, self.term, prev_term, prev, entries,
                                 commit))
        pr.commit_sent = commit
        pr.appended = True
        pr.sent(entries[-1].index if entries else prev)
        return bool(entries)

    def _broadcast_heartbeat(self, context: bytes, busy: bool = False) -> None:
        """``busy``: the tick's round. A follower sent an append since the last round has
        heard from this leader (its election clock and the check-quorum count an append as
        a heartbeat): it gets nothing, not even the commit it lacks. That rides on the next
        append, or on the next round's heartbeat when none comes (it is this one's only
        once the follower was appended to no more). Its heartbeat's answer would only have
        drawn an empty append (entries are in flight) and that append's answer, and a
        commit-only append its answer: two or four messages and two Readys a round per
        follower of a busy group, for a commit whose only use on a follower is its apply,
        which waits for company anyway. A follower the append cannot reach (a probe or a
        full window out) is heartbeated, so that the answer unblocks it."""
        commit = self.log.commit
        for peer, pr in self.progress.items():
            if peer == self.id:
                continue
            appended, pr.appended = pr.appended, False
            if busy and appended and not pr.is_paused():
                continue
            known = min(pr.match, commit)
            self.msgs.append(Message(MsgType.HEARTBEAT, peer, self.id, self.term,
                                     commit=known, context=context))
            pr.commit_sent = max(pr.commit_sent, known)

    def _start_read(self, context: bytes) -> None:
        if len(self.voters()) == 1 and self.id in self.voters():
            self.read_states.append(ReadState(self.log.commit, context))
            return
        self.pending_reads.append((context, self.log.commit, {self.id}))
        self._broadcast_heartbeat(context)

    def _step_leader(self, m: Message) -> None:
        pr = self.progress.get(m.frm)
        if pr is None:
            return
        pr.recent_active = True
        if m.type is _APPEND_RESP:
            self._handle_append_resp(m, pr)
        elif m.type is MsgType.HEARTBEAT_RESP:
            # The follower is there: a lost probe or a full window must not stall it.
            pr.paused = False
            if pr.state is _REPLICATE and pr.is_paused():
                pr.inflight.popleft()
            if pr.match < self.log.last_index():
                self._send_append(m.frm)
            if m.context:
                self._ack_read(m.context, m.frm)

    def _handle_append_resp(self, m: Message, pr: Progress) -> None:
        if m.reject:
            if pr.maybe_decrease(m.index, m.hint):
                if pr.state is _REPLICATE:
                    pr.become_probe()
                self._send_append(m.frm)
            return
        was_paused = pr.is_paused()
        if not pr.maybe_update(m.index):
            return
        if pr.state is _PROBE:
            pr.become_replicate()
        elif pr.state is _SNAPSHOT and pr.match >= pr.pending_snapshot:
            pr.become_probe()
            pr.become_replicate()
        # A commit found here is not broadcast: it rides on the next append or heartbeat
        # (``_broadcast_heartbeat``, ``_send_commit``). An immediate commit-only append to
        # every follower (and its answers) cost as much as the entry's own round.
        self._maybe_commit()
        if was_paused:
            self._send_append(m.frm)
        while self._send_append(m.frm, send_empty=False):
            pass
        if m.frm == self.transferee and pr.match == self.log.last_index():
            self._send(m.frm, MsgType.TIMEOUT_NOW)

    def _ack_read(self, context: bytes, frm: str) -> None:
        for i, (ctx, _, acks) in enumerate(self.pending_reads):
            if ctx != context:
                continue
            acks.add(frm)
            voters = self.voters()
            if len(acks & voters) >= len(voters) // 2 + 1:
                # This read and every one asked before it are confirmed.
                for ctx_done, index, _ in self.pending_reads[: i + 1]:
                    self.read_states.append(ReadState(index, ctx_done))
                del self.pending_reads[: i + 1]
            return
