"""The time a shard's leader stamps into log entries.

The log's time must never run backwards (every replica applies the same ``now``), and the
timers it drives (visibility timeouts, delays, retention) must keep running at the real rate
even if the leader's wall clock is stepped back (NTP, an operator, a VM restored). So the
leader's time is its wall clock, but never below the log's last time, nor below the last
time this leader stamped plus the time elapsed since by the monotonic clock. A wall clock
stepped forward moves the log's time forward (as it would on any leader with that clock).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

Ms = Callable[[], int]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class LeaderClock:
    def __init__(self, wall_ms: Ms = wall_clock_ms, mono_ms: Ms = monotonic_ms) -> None:
        self.wall_ms = wall_ms
        self.mono_ms = mono_ms
        self._stamped: tuple[int, int] | None = None  # (time stamped, monotonic then)

    def peek(self, log_now_ms: int) -> int:
        """The time now, given the log's last applied time; nothing is recorded."""
        now = max(self.wall_ms(), log_now_ms)
        if self._stamped is not None:
            stamped, mono = self._stamped
            now = max(now, stamped + max(0, self.mono_ms() - mono))
        return now

    def stamp(self, log_now_ms: int) -> int:
        """The time for an entry about to be proposed; later times build on it."""
        mono = self.mono_ms()
        now = self.peek(log_now_ms)
        self._stamped = (now, mono)
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
