"""One timer per process for every shard engine's time-driven work.

A shard's leader proposes a Sweep when a timer, a retention, a window or garbage is due
(``ShardEngine.check_sweep``). Rather than a task per engine waking every
``SWEEP_INTERVAL_S`` to read its store, one scheduler calls every engine's check; an engine
reads its state only when it changed (an apply, a new term) and otherwise compares the
time with the due time it read last, so an idle shard costs a few comparisons a tick.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

log = logging.getLogger("sqsq.shard")

SWEEP_INTERVAL_S = 0.1


class Sweeping(Protocol):
    def check_sweep(self) -> None: ...


class SweepScheduler:
    """One timer per process for every engine's time-driven work (``check_sweep``), instead
    of one per shard: an idle shard costs a few comparisons a tick, not a task switch and a
    read of its store. ``own_timer=False``: the caller runs ``check_all`` every
    ``SWEEP_INTERVAL_S`` from a timer it has anyway (the node's Raft clock)."""

    def __init__(self, interval_s: float = SWEEP_INTERVAL_S, own_timer: bool = True) -> None:
        self.interval_s = interval_s
        self.own_timer = own_timer
        self.engines: dict[Sweeping, None] = {}  # in the order they started
        self._task: asyncio.Task | None = None

    def add(self, engine: Sweeping) -> None:
        self.engines[engine] = None
        if self._task is None and self.own_timer:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sweeps")

    async def remove(self, engine: Sweeping) -> None:
        self.engines.pop(engine, None)
        if not self.engines and self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.check_all()

    def check_all(self) -> None:
        for engine in list(self.engines):
            try:
                engine.check_sweep()
            except Exception:
                log.exception("sweep check failed")
