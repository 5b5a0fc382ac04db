"""A future that wakes one waiter in the call that settles it: ``PromptFuture``.

An asyncio future wakes whatever awaits it from the event loop's next turn (its done
callbacks are scheduled, never called). A shard leader answers a send in the turn its
entry is applied; the stream call that waits for the answer then writes the reply a turn
later, and in that turn the loop first reads whatever else has come (the other follower's
answer, on a lone send): about 25 us on every call's path here, before the reply left.

A driver that can take its coroutine's next step from inside the settling call (the stream
calls' ``EagerCall``: no task, so nothing else is running in its name) sets ``prompt`` on
the future it waits on, and is called at once when the future is done; everything else
awaits it as any future (a task's wake-up is still scheduled, as it must be: a task may
not step inside another's). The shard's engine makes its answers with this class, the
gateway's calls drive them: this module is what both share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class PromptFuture(asyncio.Future):
    """``asyncio.Future``, and ``prompt`` (one callable, set by the future's one eager
    waiter) called with the future as soon as it is done."""

    prompt: Callable[[asyncio.Future], None] | None = None

    def set_result(self, result: Any) -> None:
        super().set_result(result)
        self._prompted()

    def set_exception(self, exception: BaseException | type[BaseException]) -> None:
        super().set_exception(exception)
        self._prompted()

    def cancel(self, msg: Any = None) -> bool:
        if not super().cancel(msg):
            return False
        self._prompted()
        return True

    def _prompted(self) -> None:
        prompt = self.prompt
        if prompt is not None:
            self.prompt = None
            prompt(self)
