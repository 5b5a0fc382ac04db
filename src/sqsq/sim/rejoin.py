"""Finding 8's schedule: a follower cut off for several election timeouts, then back.

Without pre-vote and check-quorum, a node cut off raises its term at every election timeout it
waits out alone; when the cut heals its higher term reaches the leader, which steps down
though a majority heard it all along, and the group has no leader until a new election ends
(most of the 4-7 s gaps clients saw in the chaos suite's partition rows under the old
library). With them, the cut-off node's pre-votes fail while it is alone, so its term stays,
and back in touch it follows the leader it finds.

This nemesis cuts one follower off from the other nodes for 4-15 election timeouts, heals,
and watches: a leader that led all along and loses its term within a second of the heal
(ten election timeouts at the least), with no crash and no transfer, is reported
(``deposed-by-rejoin``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqsq.sim.replica import TICK_MS

if TYPE_CHECKING:
    from sqsq.sim.world import World

POLL_MS = 10
WATCH_MS = 1_000  # how long after the heal the leader is watched


class Rejoin:
    """The nemesis of scenario ``rejoin``: one cut and heal after another until the run
    calms."""

    def __init__(self, world: World) -> None:
        self.w = world
        self.rng = world.rng
        self.leader = ""
        self.term = 0
        self.notes = world.notes
        self.notes.update({"cuts": 0, "healed": 0})

    def start(self) -> None:
        self.w.after(self.rng.randint(300, 1_500), self._cut)

    def _cut(self, _: object = None) -> None:
        w = self.w
        if w.calm:
            return
        leader = w.steady_leader()
        if leader is None:
            w.after(100, self._cut)
            return
        assert leader.core is not None
        self.leader, self.term = leader.id, leader.core.term
        alone = self.rng.choice(sorted(set(w.node_ids) - {leader.id}))
        w.network.isolate([{alone}, set(w.node_ids) - {alone}])
        self.notes["cuts"] += 1
        timeout_ms = w.raft_config.election_ticks * TICK_MS
        w.after(self.rng.randint(4, 15) * timeout_ms, self._heal)

    def _heal(self, _: object) -> None:
        w = self.w
        if w.calm:
            return
        w.network.heal()
        if not self._still_leads():
            self._next()  # something else ended its term while cut (not this finding's)
            return
        self.notes["healed"] += 1
        self._watch(w.now_ms + WATCH_MS)

    def _watch(self, until_ms: int) -> None:
        w = self.w
        if w.calm:
            return
        core = w.replicas[self.leader].core
        if core is None:
            self._next()  # crashed: nothing to say about its term
        elif not self._still_leads():
            w.checker.violation(
                "deposed-by-rejoin",
                f"{self.leader} led term {self.term} with a majority all along, and a node "
                f"cut off and back made it step down (term {core.term} now)")
            self._next()
        elif w.now_ms >= until_ms:
            self._next()
        else:
            w.after(POLL_MS, lambda _: self._watch(until_ms))

    def _still_leads(self) -> bool:
        core = self.w.replicas[self.leader].core
        return core is not None and core.is_leader() and core.term == self.term

    def _next(self) -> None:
        self.w.after(self.rng.randint(500, 2_000), self._cut)
