"""The time a shard's leader stamps into log entries.

Every timer of every queue (visibility timeouts, delays, retention, deduplication windows)
runs on the log's time, so one node's wall clock must not be able to move it. The rule:

    Log time advances at the leader's monotonic rate from the last log time it knows; its
    wall clock may pull it forward or hold it back by at most ``MAX_RATE_SKEW`` (1%) of the
    elapsed monotonic time. It never goes below the log's last time.

Concretely, a clock holds an anchor (log time ``T`` at monotonic time ``M``): the last time
this leader stamped, or the last log time this replica saw applied, whichever came later.
At monotonic time ``m`` (``e = m - M`` elapsed), the time is the wall clock clamped to
``[T + e*(1 - r), T + e*(1 + r)]``, and at least the log's last time. So a node whose clock is
an hour fast that becomes leader runs the log at most 1% fast (a 60 s retention lasts at
least 59.4 s of real time), never an hour ahead at once; a clock stepped back an hour slows
it by at most 1%; a clock that drifts is followed only at its drift, up to 1%.

Followers observe the log's time as they apply it (``observe``), so a new leader starts from
the log, not from its own wall clock. A replica with nothing to go by (an empty log, or a
one-member group starting: no one else keeps the time) starts from its wall clock. A side
effect: after every replica of a shard was down, the log's time lags the wall clock by about
the downtime (what was in flight stays so for the rest of its timeout, not for less) and
closes the gap at 1% of real time; SentTimestamp and the other timestamps show the lag.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

Ms = Callable[[], int]
MAX_RATE_SKEW = 0.01  # how far the wall clock may steer the log's rate, either way


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class LeaderClock:
    def __init__(self, wall_ms: Ms = wall_clock_ms, mono_ms: Ms = monotonic_ms,
                 max_rate_skew: float = MAX_RATE_SKEW) -> None:
        self.wall_ms = wall_ms
        self.mono_ms = mono_ms
        self.max_rate_skew = max_rate_skew
        self._anchor: tuple[int, int] | None = None  # (log time, monotonic then)

    def _at(self, mono: int) -> tuple[int, int] | None:
        """The anchor's projection to ``mono``: (lowest, highest) time the rule allows."""
        if self._anchor is None:
            return None
        stamped, then = self._anchor
        elapsed = max(0, mono - then)
        slack = int(elapsed * self.max_rate_skew)
        return stamped + elapsed - slack, stamped + elapsed + slack

    def observe(self, log_now_ms: int) -> None:
        """The log's last time, as this replica (a follower, or one starting in a group of
        several) has applied it: a newer one than the anchor's becomes the anchor, at the
        moment it is seen. Seen a little after it was stamped, so a new leader starts a
        little behind real time, never ahead of it."""
        if log_now_ms <= 0:
            return  # an empty log says nothing about the time
        if self._anchor is None or log_now_ms > self._anchor[0]:
            self._anchor = (log_now_ms, self.mono_ms())

    def _now(self, log_now_ms: int, mono: int) -> int:
        wall = self.wall_ms()
        bounds = self._at(mono)
        now = wall if bounds is None else min(max(wall, bounds[0]), bounds[1])
        return max(now, log_now_ms)

    def peek(self, log_now_ms: int) -> int:
        """The time now, given the log's last applied time; nothing is recorded."""
        return self._now(log_now_ms, self.mono_ms())

    def stamp(self, log_now_ms: int) -> int:
        """The time for an entry about to be proposed; later times build on it."""
        mono = self.mono_ms()
        now = self._now(log_now_ms, mono)
        self._anchor = (now, mono)
        return now


class OffsetFileClock:
    """A wall clock that a test can step: the system clock plus the offset in milliseconds
    written in ``path`` (an integer; a missing or unreadable file means 0). The chaos suite
    steps a leader's clock back this way (see ``clock_from_env``)."""

    RECHECK_MS = 50  # re-read the file at most this often

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._offset_ms = 0
        self._checked_mono = -self.RECHECK_MS

    def __call__(self) -> int:
        mono = monotonic_ms()
        if mono - self._checked_mono >= self.RECHECK_MS:
            self._checked_mono = mono
            try:
                self._offset_ms = int(self.path.read_text().strip() or 0)
            except (OSError, ValueError):
                self._offset_ms = 0
        return wall_clock_ms() + self._offset_ms


def clock_from_env(data_dir: Path) -> Ms:
    """The wall clock a process uses: the system clock, or, if ``SQSQ_CLOCK_OFFSET_FILE``
    names a file (relative paths are inside the process's data directory, so each node of a
    local cluster has its own), a clock a test can step."""
    name = os.environ.get("SQSQ_CLOCK_OFFSET_FILE")
    return OffsetFileClock(data_dir / name) if name else wall_clock_ms
