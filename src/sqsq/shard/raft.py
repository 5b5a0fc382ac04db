"""The Raft adapter: one shard replica as a pysyncobj 0.3.17 group member, with its holes fixed.

pysyncobj runs the Raft protocol in a tick thread; this module gives it one replicated entry
point (``_entry``, taking an encoded log entry as bytes) and fixes what sqsq cannot live with,
each fix with a regression test in ``tests/shard/test_raft_fixes.py``:

1. **fsync**: its ``FileJournal`` writes through an mmap and never syncs. ``DurableJournal``
   (``journal.py``) is flushed (fdatasync) before anything depends on the log: before the
   leader counts its own entries (at the start of each tick, ahead of the commit loop) and
   before a follower answers an append (``next_node_idx``); term and vote are fsynced (file
   and directory) before a vote is asked for or given.
2. **Commit through a snapshot chunk**: a follower raises its commit index to
   ``min(leaderCommit, lastLogIndex)`` also for appends that carry no ``prevLogIdx``
   (snapshot chunks), so a deposed leader rejoining through a snapshot "commits" its own
   uncommitted tail and answers SUCCESS for it. Such messages no longer move the commit index.
3. **Compaction without a full dump**: a journal without ``fullDumpFile`` restarts empty after
   compaction. A replica always has a dump, and it holds the state machine itself (a RocksDB
   checkpoint, see ``snapshot.py``), not pysyncobj's pickled attributes.
4. **An apply that raises** is retried forever and stalls the group. Here it stops the
   replica (``on_fatal``): a broken invariant must never be skipped, and retrying a
   deterministic failure cannot help.
5. **Success only from a leader in its term**: a proposal is acknowledged only if, when its
   entry is applied, this replica still leads in the term it proposed in; otherwise the
   outcome is unknown and the caller must retry (sends carry request ids).
6. **A wiped replica never votes as itself**: a replica whose data directory is new, and that
   was not told it bootstraps a new group, is a non-voting learner until it has applied the
   leader's commit index as first seen; it then records that it voted in the current term.
7. **Snapshots beside the tick thread**: pysyncobj writes a custom serializer's dump in its
   tick thread, so a leader stops heartbeating and committing while it writes. Only the
   checkpoint is taken there; the file is written in a thread of its own (``dumps.py``).
8. **Truncation only on a conflict**: a follower deletes every entry after an append's
   ``prevLogIdx`` before adding the append's entries, even when it holds them all already
   (a leader re-sending after a reset). Entries past the append's last were acknowledged
   and may be committed; a follower that drops them (and fsyncs that before its answer) can
   leave a committed entry on a minority. Entries it already holds are skipped; an append
   that brings nothing new is answered for what it covers, and the rest is kept.

pysyncobj's private state is reached through ``_SyncObj__*`` names in this module only; the
version is pinned.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgpack
import pysyncobj.syncobj as _syncobj
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.transport import TCPTransport

from sqsq.shard.dumps import BackgroundSerializer
from sqsq.shard.journal import DurableJournal, create_journal, fsync_path

log = logging.getLogger("sqsq.raft")

MEMBER_FILE = "member"  # written once this replica is a voting member of its group
WIPED_VOTE = "sqsq:rejoined"  # votedFor after a learner catches up: no second vote this term


# pysyncobj builds its journal and its serializer inside SyncObj.__init__ through these
# module-level names.
_syncobj.createJournal = create_journal
_syncobj.Serializer = BackgroundSerializer  # fix 7


class ReplicaStopped(Exception):
    """An apply failed: the replica has stopped (see fix 4)."""


class StateMachine(Protocol):
    """What the replica applies committed entries to (the shard's store, via ``core.apply``)."""

    def apply_entry(self, index: int, data: bytes) -> Any:
        """Apply entry ``index`` once; an index at or below the applied index is skipped."""
        ...

    def write_snapshot(self, path: str, raft_data: bytes) -> Callable[[], None] | None:
        """Write the whole state as of now (and ``raft_data``) to ``path``, fsynced; or
        capture it now and return what writes the file, to run off the tick thread."""
        ...

    def read_snapshot(self, path: str) -> bytes:
        """Adopt the state in ``path`` if it is newer than ours; return its ``raft_data``."""
        ...


class Proposal(enum.Enum):
    COMMITTED = "committed"
    NOT_LEADER = "not leader"
    UNKNOWN = "outcome unknown"  # may or may not be committed: the caller must retry


@dataclass
class RaftSettings:
    self_address: str  # host:port this replica's Raft transport listens on
    peers: list[str]  # every member's address, this one included
    directory: Path
    bootstrap: bool = False  # a new directory forms a new group (else: learner until caught up)
    durable: bool = True  # fsync the journal (off: benchmarks only)
    election_timeout_s: tuple[float, float] = (0.4, 1.2)
    heartbeat_s: float = 0.1
    compaction_min_entries: int = 20_000
    compaction_min_time_s: float = 600.0
    password: str | None = None
    bind_address: str | None = None  # host:port to listen on (default: self_address)
    on_fatal: Callable[[BaseException], None] | None = None
    auto_tick: bool = True
    extra: dict = field(default_factory=dict)  # further SyncObjConf settings (tests)


class _Transport(TCPTransport):
    """Fixes that live on the wire: durability before an answer, and filtering what arrives."""

    def __init__(self, syncObj: ShardReplica, selfNode: Any, otherNodes: Any) -> None:  # noqa: N803
        self._replica = syncObj
        super().__init__(syncObj, selfNode, otherNodes)

    def send(self, node: Any, message: Any) -> bool:
        kind = message.get("type")
        if kind in ("next_node_idx", "response_vote", "request_vote"):
            self._replica.make_durable()  # fix 1: a follower acks only what is on disk
        covered = self._replica.append_covers
        if kind == "next_node_idx" and covered is not None and message["success"]:
            message = dict(message, next_node_idx=covered + 1)  # fix 8
        return super().send(node, message)

    def _onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        message = self._replica.filter_message(node, message)
        if message is not None:
            try:
                super()._onMessageReceived(node, message)
            finally:
                self._replica.append_covers = None


class ShardReplica(SyncObj):
    """One replica of one shard. Thread model: pysyncobj's tick thread applies entries and
    runs proposal callbacks; ``propose`` may be called from any thread."""

    def __init__(self, settings: RaftSettings, machine: StateMachine) -> None:
        self.settings = settings
        self.machine = machine
        self.fatal: BaseException | None = None
        # fix 8: while an append that brought nothing new is handled, the last index it
        # covers (its answer says that much, not this replica's whole log)
        self.append_covers: int | None = None
        self._tick_actions: deque[Callable[[], None]] = deque()  # run by the tick thread
        directory = settings.directory
        directory.mkdir(parents=True, exist_ok=True)
        member = directory / MEMBER_FILE
        self.learner = not member.exists() and not settings.bootstrap
        self._catch_up_to: int | None = None
        if not member.exists() and settings.bootstrap:
            _write_durably(member, b"bootstrap\n")
        lo, hi = settings.election_timeout_s
        conf = SyncObjConf(
            journalFile=str(directory / "raft.journal"),
            fullDumpFile=str(directory / "raft.dump"),  # fix 3
            serializer=self._serialize, deserializer=self._deserialize,
            appendEntriesUseBatch=False,  # latency: the adapter does group commit itself
            appendEntriesPeriod=settings.heartbeat_s,
            raftMinTimeout=lo, raftMaxTimeout=hi,
            # An isolated leader steps down within about one election timeout (default 30 s).
            leaderFallbackTimeout=hi,
            connectionTimeout=max(hi * 2, 2.0), connectionRetryTime=0.3,
            logCompactionMinEntries=settings.compaction_min_entries,
            logCompactionMinTime=settings.compaction_min_time_s,
            commandsWaitLeader=False, dynamicMembershipChange=True,
            password=settings.password, autoTick=settings.auto_tick,
            # pysyncobj would listen on 0.0.0.0 given only its own address: every interface
            bindAddress=settings.bind_address or settings.self_address,
            **settings.extra,
        )
        others = [p for p in settings.peers if p != settings.self_address]
        super().__init__(settings.self_address, others, conf, transportClass=_Transport)

    # ---- the one replicated entry point ----
    @replicated
    def _entry(self, data: bytes) -> Any:
        index = self.raftLastApplied + 1  # pysyncobj counts this entry after we return
        try:
            return self.machine.apply_entry(index, data)
        except BaseException as exc:  # fix 4: stop; never skip or retry a broken apply
            self._die(exc)
            raise ReplicaStopped from exc  # unwinds pysyncobj before it counts the entry

    def _die(self, exc: BaseException) -> None:
        self.fatal = exc
        log.critical("replica %s: apply failed, stopping: %r", self.settings.self_address, exc)
        handler = self.settings.on_fatal
        if handler is None:
            os._exit(70)
        handler(exc)

    def propose(self, data: bytes, done: Callable[[Proposal, Any], None]) -> None:
        """Append ``data`` as one entry; ``done(status, result)`` runs in the tick thread."""
        if self.fatal is not None or not self._isLeader():
            done(Proposal.NOT_LEADER, None)
            return
        term = self.raftCurrentTerm

        def on_result(result: Any, error: int) -> None:
            if error == FAIL_REASON.SUCCESS and self._isLeader() and self.raftCurrentTerm == term:
                done(Proposal.COMMITTED, result)  # fix 5
            elif error in (FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER,
                           FAIL_REASON.QUEUE_FULL, FAIL_REASON.REQUEST_DENIED):
                done(Proposal.NOT_LEADER, None)  # never appended here
            else:
                done(Proposal.UNKNOWN, None)

        self._entry(data, callback=on_result)

    # ---- membership: one member added or removed at a time, by the leader ----
    def members(self) -> frozenset[str]:
        """The group's members as this replica's log has them (itself included)."""
        while True:
            try:  # the tick thread may change the set under us: copy, retry if it did
                others = frozenset(n.id for n in self._SyncObj__otherNodes)  # type: ignore[attr-defined]
                return others | {self.settings.self_address}
            except RuntimeError:
                continue

    def transfer_leadership(self, pick: int = 0) -> None:
        """Ask a caught-up connected follower to stand for election now (Raft's TimeoutNow),
        so the group has a new leader in a round trip rather than an election timeout after
        this one stops: of the followers that hold the whole log, in address order, the
        ``pick``-th (modulo their number), so a node handing several shards over spreads
        them (pysyncobj's own choice is always the same node). Nothing happens while none
        holds the whole log; the caller watches ``is_leader`` and may ask again."""
        self._tick_actions.append(lambda: self._transfer_to_caught_up(pick))
        self._wake_tick()

    def _wake_tick(self) -> None:
        """Tick again at once rather than after the poll's timeout (pysyncobj has its pipe
        notifier when appends are not batched, as configured here)."""
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            notifier.notify()

    def _transfer_to_caught_up(self, pick: int) -> None:  # in the tick thread
        if not self._isLeader():
            return
        last = self._SyncObj__getCurrentLogIndex()  # type: ignore[attr-defined]
        match = self._SyncObj__raftMatchIndex  # type: ignore[attr-defined]
        connected = self._SyncObj__connectedNodes  # type: ignore[attr-defined]
        ready = sorted((n for n in self._SyncObj__otherNodes  # type: ignore[attr-defined]
                        if n in connected and match.get(n, 0) == last), key=lambda n: n.id)
        if ready:
            self.transferLeadership(ready[pick % len(ready)])

    def change_member(self, add: str | None, remove: str | None,
                      done: Callable[[bool], None]) -> None:
        """Add or remove one member (Raft's single-server change, applied when appended);
        ``done(ok)`` runs in the tick thread once the change commits or fails."""
        if self.fatal is not None or not self._isLeader():
            done(False)
            return

        def on_result(_result: Any, error: int) -> None:
            done(error == FAIL_REASON.SUCCESS)

        if add is not None:
            self.addNodeToCluster(add, callback=on_result)
        elif remove is not None:
            self.removeNodeFromCluster(remove, callback=on_result)

    # ---- status ----
    def is_leader(self) -> bool:
        return self.fatal is None and self._isLeader()

    def leader_address(self) -> str | None:
        leader = self._getLeader()
        return None if leader is None else leader.id

    def leader_in_touch(self) -> str | None:
        """The leader's address if this replica leads or has heard from it within an election
        timeout; None otherwise. (A follower cut off from every peer never campaigns, so it
        would name its old leader forever: ``leader_address`` alone cannot say it is gone.)"""
        leader = self.leader_address()
        if leader is None or self.is_leader():
            return leader
        if _syncobj.monotonicTime() > self._SyncObj__raftElectionDeadline:  # type: ignore[attr-defined]
            return None
        return leader

    def behind(self) -> int:
        """Entries committed, as the leader last said, that this replica has not applied."""
        leader_commit = self._SyncObj__leaderCommitIndex or 0  # type: ignore[attr-defined]
        return max(leader_commit, self.raftCommitIndex) - self.raftLastApplied

    def status(self) -> dict:
        return self.getStatus()

    # ---- fixes applied on every tick and message ----
    @property
    def journal(self) -> DurableJournal:
        return self._SyncObj__raftLog  # type: ignore[attr-defined]

    def make_durable(self) -> None:
        if self.settings.durable:
            self.journal.sync()

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N803
        if self.fatal is not None:
            if timeToWait:
                threading.Event().wait(timeToWait)
            return
        self.make_durable()  # fix 1: the leader counts only entries it has on disk
        while self._tick_actions:
            self._tick_actions.popleft()()
        if self.learner:
            self._learner_tick()
        try:
            super()._onTick(timeToWait)
        except ReplicaStopped:
            pass  # fatal is set: this replica ticks no more

    def _checkCommandsToApply(self) -> None:  # noqa: N802
        super()._checkCommandsToApply()
        if self.journal.dirty and self.raftCommitIndex < self.journal[-1][1]:
            # Entries were just appended (and sent to the followers): tick again at once, so
            # this replica's flush (at the start of every tick) runs while the followers
            # write theirs, not after their answers wake the poll. A one-member group has no
            # answer to wait for at all. (Three nodes on this machine's one disk: send-c1
            # p50 2.43-2.61 ms against 2.99-3.11, steady-10x100B +10%.)
            self._wake_tick()

    def filter_message(self, node: Any, message: Any) -> Any:
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "append_entries" and "prevLogIdx" not in message:
            # fix 2: a snapshot chunk says nothing about which of our entries are committed
            message = dict(message, commit_index=0)
        if self.learner:
            if kind == "request_vote":
                return None  # fix 6: no vote before catching up
            if kind == "append_entries" and "prevLogIdx" in message and \
                    self._catch_up_to is None and message["term"] >= self.raftCurrentTerm:
                self._catch_up_to = message["commit_index"]
        if kind == "append_entries" and "prevLogIdx" in message and \
                "transmission" not in message and message["term"] >= self.raftCurrentTerm:
            message = self._skip_held_entries(message)
        return message

    def _skip_held_entries(self, message: dict) -> dict:
        """Fix 8: an append without the entries this replica holds already (same index and
        term); one that brings nothing new becomes a heartbeat at this replica's last entry,
        answered (``append_covers``) and committing only as far as the append reached."""
        last = self._SyncObj__getCurrentLogIndex()  # type: ignore[attr-defined]
        prev, prev_term = message["prevLogIdx"], message["prevLogTerm"]
        if prev >= last:
            return message  # nothing after prevLogIdx to lose
        held = self._SyncObj__getEntries(prev, 1)  # type: ignore[attr-defined]
        if not held or held[0][2] != prev_term:
            return message  # compacted past it, or a mismatch: pysyncobj answers that
        entries = list(message.get("entries") or ())
        skipped = 0
        for _command, idx, term in entries:
            ours = self._SyncObj__getEntries(idx, 1) if idx <= last else []  # type: ignore[attr-defined]
            if not ours or ours[0][2] != term:
                break
            prev, prev_term = idx, term
            skipped += 1
        if skipped < len(entries):  # a conflict (truncated from there, rightly) or new ones
            if not skipped:
                return message
            return dict(message, prevLogIdx=prev, prevLogTerm=prev_term,
                        entries=entries[skipped:])
        self.append_covers = prev
        last_term = self._SyncObj__getCurrentLogTerm()  # type: ignore[attr-defined]
        return dict(message, prevLogIdx=last, prevLogTerm=last_term, entries=[],
                    commit_index=min(message["commit_index"], prev))

    def _learner_tick(self) -> None:
        now = _syncobj.monotonicTime()
        self._SyncObj__raftElectionDeadline = now + 3600.0  # never campaign while learning
        target = self._catch_up_to
        if target is None or self.raftLastApplied < target:
            return
        # Caught up: this member may have voted in this term before it was wiped.
        self._SyncObj__setCurrentTerm(self.raftCurrentTerm, WIPED_VOTE)
        _write_durably(self.settings.directory / MEMBER_FILE, b"rejoined\n")
        self.learner = False
        lo, hi = self.settings.election_timeout_s
        self._SyncObj__raftElectionDeadline = now + hi
        log.info("replica %s caught up to %d and votes again", self.settings.self_address,
                 target)

    # ---- snapshots: the state machine's own checkpoint, plus pysyncobj's raft data ----
    def _serialize(self, path: str, raft_data: Any) -> Callable[[], None] | None:
        last, prev, cluster = raft_data
        return self.machine.write_snapshot(path, _pack_raft_data(last, prev, cluster))

    @property
    def snapshots_written(self) -> int:
        """This replica's own dumps that became its dump file, since start (a dump the leader
        sent meanwhile replaces one being written, which then does not count)."""
        return self._SyncObj__serializer.written  # type: ignore[attr-defined]

    @property
    def snapshot_bytes(self) -> int:
        """The size of the last of them."""
        return self._SyncObj__serializer.written_bytes  # type: ignore[attr-defined]

    def _deserialize(self, path: str) -> tuple:
        last, prev, members = _unpack_raft_data(self.machine.read_snapshot(path))
        # pysyncobj drops this replica from the dump's members by comparing each with its own
        # Node object, which never equals an address string: leave it out here, or the
        # replica would count itself among its peers after every snapshot it loads.
        return last, prev, [m for m in members if m != self.settings.self_address]


def _pack_raft_data(last: tuple, prev: tuple, cluster: Any) -> bytes:
    members = sorted(getattr(n, "id", str(n)) for n in cluster)
    return msgpack.packb([list(last), list(prev), members], use_bin_type=True)


def _unpack_raft_data(raw: bytes) -> tuple:
    last, prev, members = msgpack.unpackb(raw, raw=False)
    return tuple(last), tuple(prev), list(members)


def _write_durably(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent, directory=True)
