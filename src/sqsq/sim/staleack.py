"""Finding 4's window, reached on purpose: an acknowledgement from an older term arriving at
the node that asked for it, once it has lost those entries and leads again.

Random faults almost never get there. In three replicas an acknowledgement really sent in an
older term stays true of the leader's log (what it and one follower held, every later leader
holds). In five it can lie only when it arrives after the same node leads again with entries
of its new term at or below the index acknowledged, while a third replica takes them: no
seed of 200 random runs met that. This nemesis steers a five-node group there, with the
faults a network and an operator make (a partition, packets stuck for a while, a leadership
transfer, a crash), nodes and moments drawn from the seed:

1. The leader A is cut off with one follower F (and the clients from the other three): A
   appends what the clients send, F takes it and answers, and F's answers to A are held back.
2. The other three elect B, whose log ends below the entries F acknowledged.
3. The cut heals; A and F follow B, and A's log is cut back to B's. B hands its leadership to
   A. A's appends from then on reach X (one of the three) alone.
4. A leads a new term with its first entry, n, at or below an index F acknowledged in step 1,
   and F's old answer about that index is delivered now.
5. A and X crash a moment later; the other three elect a leader without entry n.

With acknowledgements checked for their term, A ignores F's answer and commits nothing (it and
X are two of five). Without (``Safeguards.stale_responses_ignored`` off), A counts F, commits
and applies n, and the next leader lacks it: the checker reports leader completeness.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sqsq.raft import Message, MsgType, RaftNode
from sqsq.sim.wire import SnapshotChunk

if TYPE_CHECKING:
    from sqsq.sim.world import World

POLL_MS = 5
GIVE_UP_MS = 3_000  # a step not reached by then: the attempt is abandoned, the cuts healed
COMMIT_WAIT_MS = 60  # after F's old answer: A commits within its own write and X's answer
_APPENDS = (MsgType.APPEND, MsgType.HEARTBEAT, MsgType.SNAPSHOT)


class StaleAck:
    """The nemesis of scenario ``stale-ack``: one attempt after another until the run calms."""

    def __init__(self, world: World) -> None:
        self.w = world
        self.rng = world.rng
        self.a = self.f = self.b = self.x = ""
        self.rest: list[str] = []
        self.term = 0  # A's term when it was cut off
        self.n = 0  # the first index of A's new term
        # attempts begun, and those that delivered a stale answer about A's new entry
        self.notes = world.notes
        self.notes.update({"attempts": 0, "reached": 0})

    def start(self) -> None:
        self.w.after(self.rng.randint(300, 1_500), self._begin)

    # ---- steps -------------------------------------------------------------------------------

    def _begin(self, _: object = None) -> None:
        w = self.w
        if w.calm:
            return
        a = w.steady_leader()
        if a is None or len(w.node_ids) != 5:
            w.after(100, self._begin)
            return
        self.notes["attempts"] += 1
        assert a.core is not None
        self.a, self.term = a.id, a.core.term
        others = sorted(set(w.node_ids) - {a.id})
        self.f = self.rng.choice(others)
        self.rest = [n for n in others if n != self.f]
        self.x = self.rng.choice(self.rest)
        f, leader = self.f, self.a
        w.network.hold("f-answers", lambda frm, to, p: frm == f and to == leader)
        w.network.isolate([{self.a, self.f}, set(self.rest)])
        w.network.isolate([set(w.clients), set(self.rest)])
        self._wait(self._other_side_leads, self._heal)

    def _other_side_leads(self) -> bool:
        b = self.w.sole_leader(self.rest)
        if b is None or b.core is None or b.core.term <= self.term:
            return False
        log = b.core.log
        if log.commit < log.last_index():
            return False  # its first entry is not committed yet
        self.b = b.id
        return True

    def _heal(self) -> None:
        """Step 3: the nodes talk again (the clients to none: no new entries), A's appends
        reach X alone, and once A holds B's log B hands leadership to it."""
        w = self.w
        f_log = self._core(self.f).log
        b_last = self._core(self.b).log.last_index()
        if f_log.term(b_last + 1) != self.term:
            self._end()  # F took too little on A's side: A's next entry would be above it
            return
        w.network.heal(held=False)
        w.network.isolate([set(w.clients), set(w.node_ids)])
        leader, x = self.a, self.x
        w.network.hold("a-appends", lambda frm, to, p: frm == leader and to != x and (
            isinstance(p, SnapshotChunk) or (isinstance(p, Message) and p.type in _APPENDS)))
        self._wait(self._a_holds_b_log, self._transfer)

    def _a_holds_b_log(self) -> bool:
        a, b = self._core(self.a), self._core(self.b)
        return a.log.last_index() == b.log.last_index() and \
            a.log.last_term() == b.log.last_term() and b.is_leader()

    def _transfer(self) -> None:
        b = self.w.replicas[self.b]
        assert b.core is not None
        b.core.transfer_leadership(self.a)
        b.process()
        self._wait(self._a_leads_again, self._stale_answer)

    def _a_leads_again(self) -> bool:
        a = self._core(self.a)
        if not a.is_leader() or a.term <= self.term:
            return False
        self.n = a.log.last_index()
        return a.log.term(self.n) == a.term

    def _stale_answer(self) -> None:
        """Step 4: F's answers from A's old term about entry n (or up to A's last) arrive."""
        a = self._core(self.a)
        low, high, old = self.n, a.log.last_index(), self.term
        self.w.network.stop_holding("f-answers")
        sent = self.w.network.release(lambda frm, to, p: isinstance(p, Message) and (
            p.type is MsgType.APPEND_RESP and not p.reject and p.term == old
            and low <= p.index <= high))
        if not sent:
            self._end()
            return
        self.notes["reached"] += 1
        deadline = self.w.now_ms + COMMIT_WAIT_MS
        self._wait(lambda: self.w.now_ms >= deadline or
                   self.w.replicas[self.a].machine.applied >= self.n, self._crash)

    def _crash(self) -> None:
        """Step 5: A and X go down; the other three elect a leader from what they hold."""
        w = self.w
        for node in (self.a, self.x):
            replica = w.replicas[node]
            if replica.up:
                replica.crash()
                w.after(self.rng.randint(300, 1_000), lambda _, r=replica: w._restart(r))
        self._end()

    def _end(self) -> None:
        self.w.network.heal()  # (packets still held are lost)
        self.w.after(self.rng.randint(1_000, 3_000), self._begin)

    # ---- helpers -----------------------------------------------------------------------------

    def _wait(self, reached: Callable[[], bool], then: Callable[[], None]) -> None:
        """``then()`` once ``reached()`` holds; the attempt ends if it does not in time or a
        node it needs went down."""
        deadline = self.w.now_ms + GIVE_UP_MS

        def check(_: object) -> None:
            w = self.w
            if w.calm:
                return
            if any(not w.replicas[n].up for n in (self.a, self.f, *self.rest)):
                self._end()
            elif reached():
                then()
            elif w.now_ms >= deadline:
                self._end()
            else:
                w.after(POLL_MS, check)

        self.w.after(POLL_MS, check)

    def _core(self, node: str) -> RaftNode:
        """The core of a node that is up (``_wait`` checked)."""
        core = self.w.replicas[node].core
        assert core is not None
        return core
