"""What a leader knows of one follower's log, and how it sends to it.

PROBE: the leader does not know where the follower's log ends; one append at a time, until
one is accepted. REPLICATE: appends are pipelined, up to ``max_inflight`` unanswered ones.
SNAPSHOT: the follower needs entries the leader has compacted; nothing is sent until the
snapshot is answered (or given up on).
"""

from __future__ import annotations

import enum
from collections import deque


class ProgressState(enum.IntEnum):
    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2


_PROBE, _REPLICATE = ProgressState.PROBE, ProgressState.REPLICATE  # (cheaper than the class's)

class Progress:
    __slots__ = ("match", "next", "state", "paused", "pending_snapshot", "recent_active",
                 "silent_rounds", "inflight", "max_inflight", "snapshot_ticks", "commit_sent",
                 "appended")

    def __init__(self, next_index: int, max_inflight: int) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.paused = False
        self.pending_snapshot = 0
        self.recent_active = False  # heard from since the last check-quorum round
        self.silent_rounds = 0  # check-quorum rounds in a row it was not heard from
        self.inflight: deque[int] = deque()  # last index of each unanswered append
        self.max_inflight = max_inflight
        self.snapshot_ticks = 0
        self.commit_sent = 0  # the highest commit index sent to it (append or heartbeat)
        self.appended = False  # an append went to it since the last heartbeat round

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self.state = ProgressState.PROBE
        self.paused = False
        self.inflight.clear()

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.paused = False
        self.inflight.clear()

    def become_snapshot(self, index: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = index
        self.snapshot_ticks = 0
        self.inflight.clear()

    def is_paused(self) -> bool:
        state = self.state
        if state is _REPLICATE:
            return len(self.inflight) >= self.max_inflight
        if state is _PROBE:
            return self.paused
        return True

    def sent(self, last: int) -> None:
        """An append ending at ``last`` went out (``last`` = next - 1 for an empty one)."""
        if self.state is _REPLICATE:
            if last >= self.next:
                self.next = last + 1
                self.inflight.append(last)
        else:
            self.paused = True

    def maybe_update(self, index: int) -> bool:
        """An accepted append up to ``index``; False if it tells nothing new."""
        updated = index > self.match
        if updated:
            self.match = index
            self.paused = False
        self.next = max(self.next, index + 1)
        while self.inflight and self.inflight[0] <= index:
            self.inflight.popleft()
        return updated

    def maybe_decrease(self, rejected: int, hint: int) -> bool:
        """A refused append whose previous entry was ``rejected``; the follower's log ends at
        ``hint``. False if the refusal is stale (an answer to an older append)."""
        if hint < self.match:
            # Its log ends before what it acknowledged: it lost its disk and came back under
            # its old name (or this is an old refusal overtaken by later answers; starting
            # again from the hint only costs a resend). Lowering match is always safe.
            self.match = hint
            self.next = hint + 1
            self.state = ProgressState.PROBE
            self.paused = False
            self.inflight.clear()
            return True
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, hint + 1), self.match + 1, 1)
        self.paused = False
        return True
