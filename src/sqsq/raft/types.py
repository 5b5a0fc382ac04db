"""What goes into and comes out of the consensus core: entries, messages, hard state,
snapshot metadata and the ``Ready`` a host acts on.

Everything here is a frozen value. Node ids are strings (the host decides what they name: an
address, a replica id). The core never looks inside an entry's data, except for membership
changes, which it encodes itself.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class MsgType(enum.IntEnum):
    APPEND = 1  # entries (maybe none) after (index, log_term), and the leader's commit
    APPEND_RESP = 2  # index: last index now matched; or reject with index = the refused prev
    VOTE = 3
    VOTE_RESP = 4
    PRE_VOTE = 5  # "would you vote for me in term+1?": changes nobody's term
    PRE_VOTE_RESP = 6
    HEARTBEAT = 7  # commit (bounded by the follower's match) and a read context, if any
    HEARTBEAT_RESP = 8
    SNAPSHOT = 9  # snapshot metadata; the host carries the data beside it, whole or not at all
    TIMEOUT_NOW = 10  # leadership transfer: campaign at once, the lease notwithstanding


class Role(enum.IntEnum):
    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


class EntryKind(enum.IntEnum):
    NORMAL = 0  # the host's data; empty data is a no-op (a new leader's first entry)
    CONF = 1  # a membership change, data = ConfChange.encode()


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    term: int
    data: bytes = b""
    kind: EntryKind = EntryKind.NORMAL


@dataclass(frozen=True, slots=True)
class ConfState:
    """Who votes and who only learns. Learners receive the log but neither vote nor count
    towards a quorum; they are promoted once caught up."""

    voters: frozenset[str]
    learners: frozenset[str] = frozenset()

    def members(self) -> frozenset[str]:
        return self.voters | self.learners


class ConfOp(enum.Enum):
    BOOTSTRAP = "bootstrap"  # a new group's first entry: ``node`` is "voters|learners"
    ADD_LEARNER = "add-learner"
    PROMOTE = "promote"
    REMOVE = "remove"


@dataclass(frozen=True, slots=True)
class ConfChange:
    """One server at a time: any majority of the old voters and of the new ones overlap."""

    op: ConfOp
    node: str

    def encode(self) -> bytes:
        return f"{self.op.value} {self.node}".encode()

    @classmethod
    def decode(cls, data: bytes) -> ConfChange:
        op, node = data.decode().split(" ", 1)
        return cls(ConfOp(op), node)

    def applied_to(self, conf: ConfState) -> ConfState:
        voters, learners = set(conf.voters), set(conf.learners)
        if self.op is ConfOp.BOOTSTRAP:
            v, _, lr = self.node.partition("|")
            return ConfState(frozenset(v.split(",")), frozenset(filter(None, lr.split(","))))
        if self.op is ConfOp.ADD_LEARNER:
            learners.add(self.node)
        elif self.op is ConfOp.PROMOTE:
            learners.discard(self.node)
            voters.add(self.node)
        else:
            voters.discard(self.node)
            learners.discard(self.node)
        return ConfState(frozenset(voters), frozenset(learners))


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """A snapshot's place in the log: the state as of ``index`` (whose term is ``term``) and
    the membership as of that index."""

    index: int
    term: int
    conf: ConfState


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any message that depends on it leaves the node."""

    term: int = 0
    vote: str | None = None
    commit: int = 0


@dataclass(frozen=True, slots=True)
class Message:
    type: MsgType
    to: str
    frm: str
    term: int  # every message and every response carries the sender's term
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    hint: int = 0  # on a refused append: the follower's last index
    snapshot: SnapshotMeta | None = None
    context: bytes = b""  # read-index context, or TRANSFER on a transfer's vote


TRANSFER = b"transfer"  # a vote asked for by a leadership transfer: it may break a lease
QUIESCE = b"quiesce"  # a heartbeat that puts an idle group to sleep (no ticks until woken)


@dataclass(frozen=True, slots=True)
class ReadState:
    """A read asked for with ``context`` may be served once the host has applied ``index``."""

    index: int
    context: bytes


@dataclass(frozen=True)
class Ready:
    """What the host does, in this order: install ``snapshot`` durably, persist
    ``hard_state`` and ``entries`` durably (entries replace any the log holds from
    ``entries[0].index`` on), then send ``messages``, then apply ``committed``; then call
    ``advance``.
    Sending before persisting is how acknowledged writes get lost."""

    hard_state: HardState | None = None
    entries: tuple[Entry, ...] = ()
    snapshot: SnapshotMeta | None = None
    messages: tuple[Message, ...] = ()
    committed: tuple[Entry, ...] = ()
    read_states: tuple[ReadState, ...] = ()
    leader: str | None = None
    role: Role = Role.FOLLOWER


@dataclass(frozen=True)
class RaftConfig:
    election_ticks: int = 10  # a follower hearing nothing for this many ticks (and a random
    # part as many again) stands for election
    heartbeat_ticks: int = 1
    max_inflight: int = 64  # appends in flight to one follower (the pipeline's window)
    max_append_bytes: int = 1 << 20  # a batch of entries per append, by data size
    pre_vote: bool = True
    check_quorum: bool = True
    # A leader stands down once a majority has gone unheard for this many check-quorum rounds
    # (election timeouts) in a row. One round of silence is also what followers look like
    # whose loops are blocked in a slow fsync (on one machine, one disk stall holds them all);
    # a cut lasts. Two rounds of 0.5 s: silent for under 1.0 s, a leader leads on; for 1.5 s
    # or more, it stands down (in between, as the silence falls across the rounds).
    check_quorum_rounds: int = 2
    # An idle group goes quiet after this many ticks (0: never): every replica caught up,
    # nothing to commit, nothing read; no heartbeats until something happens. Followers stop
    # counting towards an election, so the host must wake them (``wake``) when it stops
    # hearing from the leader's node: that liveness is the host's, shared by all its shards.
    quiesce_after_ticks: int = 0


@dataclass(frozen=True)
class Safeguards:
    """Each rule that keeps an acknowledged write from being lost, as a switch, so that a
    test can turn one off and watch the simulator's checker catch the loss. Production code
    never turns one off."""

    truncate_only_at_conflict: bool = True  # finding 2
    one_conf_change_at_a_time: bool = True  # finding 3
    stale_responses_ignored: bool = True  # finding 4: acks carry a term
    refuse_snapshot_behind_commit: bool = True  # finding 9
    # finding 8, pre-vote and check-quorum, are RaftConfig's pre_vote and check_quorum


def bootstrap(voters: frozenset[str] | set[str], learners: frozenset[str] | set[str] = frozenset()
              ) -> tuple[HardState, SnapshotMeta, tuple[Entry, ...]]:
    """What every first member of a new group starts from: the membership as the log's first
    entry, committed. It must be in the log, not only in each member's own start-up state:
    a server that joins later learns who votes from the log (or a snapshot), never from
    nowhere."""
    members = ",".join(sorted(voters)) + "|" + ",".join(sorted(learners))
    entry = Entry(1, 1, ConfChange(ConfOp.BOOTSTRAP, members).encode(), EntryKind.CONF)
    return HardState(term=1, commit=1), SnapshotMeta(0, 0, ConfState(frozenset())), (entry,)
