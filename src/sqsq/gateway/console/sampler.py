"""The console's depth history: every queue's depth, sampled periodically into a ring buffer
per queue that holds the last hour. In memory only: a restarted process starts a new chart.

Only queues that exist are kept: a queue missing from a sample loses its history.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqsq.gateway.console.sources import Depth

log = logging.getLogger("sqsq.console")

HISTORY_S = 3600.0
DEFAULT_INTERVAL_S = 10.0
ENV_INTERVAL = "SQSQ_CONSOLE_SAMPLE_S"  # the sampling period, in seconds (tests shorten it)


@dataclass(frozen=True)
class Sample:
    at_s: float  # wall clock (seconds since the epoch)
    visible: int
    in_flight: int
    delayed: int


def interval_from_env() -> float:
    raw = os.environ.get(ENV_INTERVAL, "")
    try:
        value = float(raw) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        raise ValueError(f"{ENV_INTERVAL} must be a number of seconds, not {raw!r}") from None
    if not 0.1 <= value <= HISTORY_S:
        raise ValueError(f"{ENV_INTERVAL} must be between 0.1 and {HISTORY_S:g} seconds")
    return value


class DepthHistory:
    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.capacity = max(2, int(HISTORY_S / interval_s) + 1)
        self._queues: dict[str, deque[Sample]] = {}

    def record(self, depths: dict[str, Depth], at_s: float) -> None:
        for gone in self._queues.keys() - depths.keys():
            del self._queues[gone]
        for key, (visible, in_flight, delayed) in depths.items():
            ring = self._queues.get(key)
            if ring is None:
                ring = self._queues[key] = deque(maxlen=self.capacity)
            ring.append(Sample(at_s, visible, in_flight, delayed))

    def samples(self, key: str, since_s: float | None = None) -> list[Sample]:
        ring = self._queues.get(key, ())
        return [s for s in ring if since_s is None or s.at_s >= since_s]

    async def run(self, read: Callable[[], Awaitable[dict[str, Depth]]],
                  clock: Callable[[], float] = time.time) -> None:
        """Sample every ``interval_s`` until cancelled; a failed sample is skipped (the
        process keeps serving with the cluster away)."""
        while True:
            started = time.monotonic()
            try:
                self.record(await read(), clock())
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a gap in the chart, not a crash
                log.debug("console: depth sample failed: %s", e)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
