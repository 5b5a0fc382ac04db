"""A stand-in for the ``time`` module inside one module under test: its ``monotonic`` moves
only when the test moves it, so a call that "takes a second" takes none. Patched as that
module's ``time`` name (``monkeypatch.setattr(module, "time", ModuleClock())``), never as the
real ``time.monotonic``, which the event loop and every other module read."""

from __future__ import annotations

import time


class ModuleClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    sleep = staticmethod(time.sleep)
