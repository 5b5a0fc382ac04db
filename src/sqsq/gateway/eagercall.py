"""A stream call's coroutine, driven without a task: its first step runs at once, in the turn
of the event loop that read the call, and each later one when the future it waits on is done.

A task's first step runs a turn of the loop after the task is made. A send read off a client
connection spent that turn before it reached its shard's proposer, whose entry went out at
the end of the turn after: on a lone replicated send, a turn of the loop on the leader's side
of every call. Started at once, the call reaches the proposer in the turn that read it. After
that it is woken as a task is (the future's done callback, a turn after the future's result
is set), or, by a ``sqsq.prompt.PromptFuture`` (the shard engine's answers), in the call
that sets the result: nothing waits longer than under a task, and no task is made per call.

What a task gives its coroutine, this keeps: one context of its own for every step (a call's
log fields stay its own), and cancellation (the future it waits on is cancelled, which the
coroutine sees as ``CancelledError`` there; between steps, the error is thrown in at the
next). The coroutine must handle its own exceptions (the stream's calls turn every failure
into a reply); one that escapes is logged. Not kept: ``asyncio.current_task()`` is None
inside, so a call must not use ``asyncio.timeout`` (none does; ``asyncio.wait_for`` and
``asyncio.sleep`` need no task).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine
from typing import Any

from sqsq.prompt import PromptFuture

log = logging.getLogger("sqsq.gateway")


class EagerCall:
    """``coro`` driven from ``start``; ``cancel`` at any point, as ``Task.cancel``."""

    __slots__ = ("_loop", "_coro", "_context", "_waiting", "_cancelled")

    def __init__(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]) -> None:
        self._loop = loop
        self._coro = coro
        self._context = contextvars.copy_context()
        self._waiting: asyncio.Future | None = None
        self._cancelled = False  # thrown in at the next step

    def start(self) -> None:
        """Run the coroutine until it first waits (or ends)."""
        self._step()

    def cancel(self) -> None:
        waiting = self._waiting
        if waiting is None or not waiting.cancel():
            self._cancelled = True  # (its future is done already: the next step is due)

    def _step(self, _: Any = None) -> None:
        self._waiting = None
        coro = self._coro
        try:
            if self._cancelled:
                self._cancelled = False
                yielded = self._context.run(coro.throw, asyncio.CancelledError())
            else:
                yielded = self._context.run(coro.send, None)
        except (StopIteration, asyncio.CancelledError):
            return
        except (KeyboardInterrupt, SystemExit):
            raise  # (as a task lets them through to the loop)
        except BaseException:  # noqa: BLE001 - as a task's would, but nobody awaits it
            log.exception("a stream call failed")
            return
        if getattr(yielded, "_asyncio_future_blocking", None):  # ``await`` of a future
            yielded._asyncio_future_blocking = False
            self._waiting = yielded
            if type(yielded) is PromptFuture and yielded.prompt is None:
                yielded.prompt = self._step  # in the call that answers it
            else:
                yielded.add_done_callback(self._step)
            if self._cancelled and yielded.cancel():
                self._cancelled = False
        elif yielded is None:  # a bare yield (``asyncio.sleep(0)``): the next turn
            self._loop.call_soon(self._step)
        else:  # what a task refuses ("bad yield") ends the call here
            log.error("a stream call yielded %r, not a future", yielded)
            self._context.run(coro.close)
