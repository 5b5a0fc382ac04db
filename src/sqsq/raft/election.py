"""Elections, the consensus core's other half beside the leader's: campaigns (pre-vote first,
so a node cut off raises nobody's term), the votes a node grants, and the count. ``RaftNode``
mixes it in; it is split out only to keep each file readable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqsq.raft.types import TRANSFER, Message, MsgType, Role

if TYPE_CHECKING:
    import random

    from sqsq.raft.log import RaftLog
    from sqsq.raft.types import RaftConfig

_PRE_VOTE, _VOTE = MsgType.PRE_VOTE, MsgType.VOTE
_PRE_VOTE_RESP, _VOTE_RESP = MsgType.PRE_VOTE_RESP, MsgType.VOTE_RESP
_PRE_CANDIDATE, _CANDIDATE = Role.PRE_CANDIDATE, Role.CANDIDATE
_FOLLOWER = Role.FOLLOWER
FROM_LEADER = frozenset({MsgType.APPEND, MsgType.HEARTBEAT, MsgType.SNAPSHOT})


class Electing:
    """What a node does to become leader, and to let another become one; the state it
    reads is ``RaftNode``'s."""

    id: str
    term: int
    vote: str | None
    role: Role
    lead: str | None
    cfg: RaftConfig
    rng: random.Random
    log: RaftLog
    msgs: list[Message]
    votes: dict[str, bool]
    election_elapsed: int
    timeout: int
    quiesced: bool

    if TYPE_CHECKING:  # declared only: the real ones are RaftNode's and Leading's
        def voters(self) -> frozenset[str]: ...
        def _reset(self, term: int) -> None: ...
        def _become_follower(self, term: int, lead: str | None) -> None: ...
        def _become_leader(self) -> None: ...
        def _step_follower(self, m: Message) -> None: ...
        def _send(self, to: str, kind: MsgType, **fields: object) -> None: ...

    def _reset_timeout(self) -> None:
        self.timeout = self.cfg.election_ticks + self.rng.randrange(self.cfg.election_ticks)

    def forget_leader(self) -> None:
        """The host learned that the leader's process is gone (its node refused a
        connection): stop counting on its lease, and stand within a tick or two.

        Without this a follower waits out its whole election timeout, and the lease
        (check-quorum) makes the other follower refuse its pre-vote if that one heard the
        leader a tick later: the candidate then waits a whole timeout again. Safety never
        rests on it: a leader forgotten while alive only costs an election, which its
        lease on the other followers may refuse. The tick is drawn at random so that two
        followers that learn it together rarely stand together."""
        if self.role is not _FOLLOWER or self.lead is None:
            return
        self.lead = None
        self.quiesced = False
        soon = 1 + self.rng.randrange(max(2, self.cfg.election_ticks // 4))
        self.election_elapsed = max(self.election_elapsed, self.timeout - soon)

    def _promotable(self) -> bool:
        return self.id in self.voters()

    def _campaign(self, *, pre: bool, transfer: bool) -> None:
        if pre:
            self._reset(self.term)
            self.role = _PRE_CANDIDATE
            term, kind = self.term + 1, _PRE_VOTE
        else:
            self._reset(self.term + 1)
            self.role = _CANDIDATE
            self.vote = self.id
            term, kind = self.term, _VOTE
        self.votes = {self.id: True}
        if self._tally() is True:
            return
        for peer in sorted(self.voters() - {self.id}):
            self.msgs.append(Message(kind, peer, self.id, term, log_term=self.log.last_term(),
                                     index=self.log.last_index(),
                                     context=TRANSFER if transfer else b""))

    def _tally(self) -> bool | None:
        """Count the votes: True if won (and acted on), False if lost."""
        voters = self.voters()
        granted = sum(1 for v, ok in self.votes.items() if ok and v in voters)
        refused = sum(1 for v, ok in self.votes.items() if not ok and v in voters)
        quorum = len(voters) // 2 + 1
        if granted >= quorum:
            if self.role is _PRE_CANDIDATE:
                self._campaign(pre=False, transfer=False)
            else:
                self._become_leader()
            return True
        if refused >= quorum:
            self._become_follower(self.term, None)
            return False
        return None

    def _handle_vote(self, m: Message) -> None:
        pre = m.type is _PRE_VOTE
        can_vote = (self.vote == m.frm or (self.vote is None and self.lead is None)
                    or (pre and m.term > self.term))
        resp = _PRE_VOTE_RESP if pre else _VOTE_RESP
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            # A pre-vote is answered in the term it asks about, so the candidate counts it.
            self.msgs.append(Message(resp, m.frm, self.id, m.term))
            if not pre:
                self.election_elapsed = 0
                self.vote = m.frm
        else:
            self._send(m.frm, resp, reject=True)

    def _step_candidate(self, m: Message) -> None:
        if m.type in FROM_LEADER:
            self._become_follower(m.term, m.frm)  # a leader of this term exists
            self._step_follower(m)
        elif (m.type is _PRE_VOTE_RESP and self.role is _PRE_CANDIDATE) or (
                m.type is _VOTE_RESP and self.role is _CANDIDATE):
            self.votes.setdefault(m.frm, not m.reject)
            self._tally()
