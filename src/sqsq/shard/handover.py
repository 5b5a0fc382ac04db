"""A shard leader's hand-over before a graceful stop, for ``ShardEngine``: nothing new
admitted, what is in flight committed, and leadership handed to a caught-up follower
(``RaftReplica.transfer_leadership``, Raft's TimeoutNow), so the shard has a leader again
within a round trip rather than an election timeout after this replica stops. The control
agent asks for it too, to move a leader where the partition map wants it."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqsq.shard.proposer import Proposer
    from sqsq.shard.replica import RaftReplica

HAND_OVER_TIMEOUT_S = 2.0  # a graceful stop waits this long at most for a follower to lead
HAND_OVER_POLL_S = 0.02
HAND_OVER_RETARGET_S = 0.3  # a follower asked to take over that has not by then is passed over
HAND_OVER_SLACK = 64  # entries a named successor may lack for a hand-over to start


class HandOver:
    """Mixed into ``ShardEngine``, whose state it works on: while ``_handing_over`` is set,
    the engine admits no request (``ShardEngine._admit`` waits for it)."""

    replica: RaftReplica
    proposer: Proposer
    _closing: bool
    _loop: asyncio.AbstractEventLoop | None
    _handing_over: asyncio.Future | None

    async def hand_over(self, pick: int = 0, timeout_s: float = HAND_OVER_TIMEOUT_S,
                        to: str | None = None) -> str | None:
        """Before a graceful stop, if this replica leads a group of several: admit nothing
        new, let what is in flight commit, and hand leadership to a caught-up follower, so
        the shard has a leader again within a round trip instead of an election timeout
        after this replica stops. A request that arrives meanwhile waits, then is answered
        NotLeader naming the new leader. Returns the new leader's Raft address; None if this
        replica did not lead, or still leads after ``timeout_s`` (its stop then costs an
        election, as a crash does). ``pick`` chooses among the caught-up followers
        (``RaftReplica.transfer_leadership``); ``to`` names the one (a Raft address), and
        no other is asked."""
        if self._closing or self._loop is None or not self.replica.is_leader() or \
                len(self.replica.members()) <= 1:
            return None
        if to is not None and not self.replica.near(to, HAND_OVER_SLACK):
            # Far behind (a node just restarted) or gone: requests would be held while it
            # catches up. Not now; the balancer asks again later.
            return None
        done = self._loop.create_future()
        self._handing_over = done
        deadline = time.monotonic() + timeout_s
        try:
            # What was admitted commits first (an entry answered "outcome unknown" would
            # cost its caller a retry).
            while self.proposer.busy and time.monotonic() < deadline:
                await asyncio.sleep(HAND_OVER_POLL_S)
            # Nothing happens while no follower holds the whole log: ask until one does. A
            # follower that has not taken over by then is passed over for the next (it may
            # have stopped, its silence not noticed yet). With every other node gone (the
            # last of a cluster stopping) there is nobody to wait for.
            asked = time.monotonic()
            while time.monotonic() < deadline and (
                    self.replica.is_leader() or self.replica.leader_address() is None):
                if self.replica.is_leader():
                    tries = int((time.monotonic() - asked) / HAND_OVER_RETARGET_S)
                    if not self.replica.transfer_leadership(pick + tries, to):
                        break
                await asyncio.sleep(HAND_OVER_POLL_S)
        finally:
            self._handing_over = None
            done.set_result(None)
        return None if self.replica.is_leader() else self.replica.leader_address()
