"""Long polls parked on a shard's leader, per queue, until an effect of an applied entry (a
send, a message come due) wakes them."""

from __future__ import annotations

import asyncio


class Waiters:
    """Long polls parked per queue; an effect wakes every poll on that queue."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self.parked = 0  # receives waiting right now (metrics)

    def event(self, queue: str) -> asyncio.Event:
        ev = self._events.get(queue)
        if ev is None:
            ev = self._events[queue] = asyncio.Event()
        return ev

    async def park(self, event: asyncio.Event, timeout_s: float) -> None:
        """Wait until ``event`` is set or ``timeout_s`` passes, counted in ``parked``."""
        self.parked += 1
        try:
            await asyncio.wait_for(event.wait(), timeout=timeout_s)
        except TimeoutError:
            pass
        finally:
            self.parked -= 1

    def wake(self, queue: str) -> None:
        ev = self._events.pop(queue, None)
        if ev is not None:
            ev.set()

    def __len__(self) -> int:
        """Queues with a poll parked on them."""
        return len(self._events)

    def forget(self, queue: str) -> None:
        """Drop a queue's event unset: a poll on a queue that does not exist must not leave
        one behind (a client could otherwise grow this map with made-up names)."""
        self._events.pop(queue, None)

    def wake_all(self) -> None:
        for queue in list(self._events):
            self.wake(queue)
