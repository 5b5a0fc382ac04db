"""Calls waiting at a node that stopped answering (frozen, cut off), abandoned once a newer
leader of their shard is known, and made again there.

A stopped leader answers nothing, not even NotLeader, so a call sent to it waits out its
deadline: a long poll up to its whole WaitTimeSeconds and more. The rest of its shard elects
a new leader within a couple of seconds, and that leader publishes a hint of a newer Raft
term (the partition map in etcd; the gateway passes it on in ``DescribeQueueRoute``). A call
at another node that began while an older term's leader was known can only be waiting on a
node that no longer leads: it is abandoned and made at the new leader, so the gap a client
sees follows the election, not the freeze.

Making it again keeps SQS's semantics: a send carries its request id (a retry is answered
with the first one's result, FIFO deduplication ids as ever), a delete of a message already
gone succeeds, and a receive abandoned at the old leader at worst left the messages it had
taken there in flight, to be received again after their visibility timeout.

``Abandon`` is one attempt's handle: the stream and frame stubs attach to it how to end the
call (``_stream``), and ``Waiting`` holds the attempts in flight per shard.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# A client with direct routing asks the gateway where a shard's leader is (the map's
# hint) every STALL_POLL_S while a call of the shard has waited STALL_AFTER_S or longer:
# a long poll included, which is the cost (one small gateway call a shard every so often).
STALL_AFTER_S = 0.5
STALL_POLL_S = 0.5
# What an abandoned call ends with (an UNAVAILABLE whose outcome is unknown); the caller
# tells it apart by its handle, never by this text.
ABANDONED = "abandoned: a newer leader of its shard is known"


class Abandon:
    """One attempt's handle: ``fire`` ends the call (once attached) with UNAVAILABLE and
    remembers the leader to go to; safe to fire from another thread."""

    __slots__ = ("_lock", "_end", "leader", "fired")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._end: Callable[[], None] | None = None
        self.leader = ""
        self.fired = False

    def attach(self, end: Callable[[], None]) -> None:
        """How to end the call; run at once if the attempt was abandoned already."""
        with self._lock:
            self._end = end
            fired = self.fired
        if fired:
            end()

    def fire(self, leader: str) -> None:
        with self._lock:
            if self.fired:
                return
            self.fired, self.leader = True, leader
            end = self._end
        if end is not None:
            end()


@dataclass
class _Attempt:
    shard: int
    node: str
    term: int  # the newest leader term known for the shard when it began
    key: object  # what the caller needs to look the shard's leader up again (a queue)
    started: float
    handle: Abandon = field(default_factory=Abandon)


class Waiting:
    """The attempts in flight, per shard; ``newer_leader`` abandons those a newer leader
    makes stale. Safe to share between threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._by_shard: dict[int, dict[int, _Attempt]] = {}
        self.abandoned = 0  # attempts abandoned so far

    def begin(self, shard: int, node: str, term: int, key: object = None) -> tuple[int, Abandon]:
        attempt = _Attempt(shard, node, term, key, self._clock())
        with self._lock:
            ident = next(self._ids)
            self._by_shard.setdefault(shard, {})[ident] = attempt
        return ident, attempt.handle

    def end(self, shard: int, ident: int) -> None:
        with self._lock:
            attempts = self._by_shard.get(shard)
            if attempts is not None:
                attempts.pop(ident, None)
                if not attempts:
                    del self._by_shard[shard]

    def newer_leader(self, shard: int, leader: str, term: int) -> int:
        """Abandon the shard's attempts at nodes other than ``leader`` that began under an
        older term than ``term`` (its leader's); how many."""
        with self._lock:
            stale = [a for a in self._by_shard.get(shard, {}).values()
                     if a.term < term and a.node != leader and not a.handle.fired]
        for attempt in stale:
            attempt.handle.fire(leader)
        self.abandoned += len(stale)
        return len(stale)

    def slow(self, after_s: float) -> dict[int, set[object]]:
        """The shards with an attempt in flight for ``after_s`` or longer, and those
        attempts' keys."""
        now = self._clock()
        out: dict[int, set[object]] = {}
        with self._lock:
            for shard, attempts in self._by_shard.items():
                keys = {a.key for a in attempts.values() if now - a.started >= after_s}
                if keys:
                    out[shard] = keys
        return out

    def __bool__(self) -> bool:
        return bool(self._by_shard)

