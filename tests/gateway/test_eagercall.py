"""``EagerCall``: a stream call's coroutine runs its first step at once, then as a task would:
woken by the future it waits on (a ``PromptFuture`` in the call that settles it), in a
context of its own, cancellable where it waits and between steps."""

from __future__ import annotations

import asyncio
import contextvars
import logging

import pytest

from sqsq.gateway.eagercall import EagerCall
from sqsq.prompt import PromptFuture

_field: contextvars.ContextVar[str] = contextvars.ContextVar("field", default="")


def test_the_first_step_runs_at_once_and_the_rest_when_the_future_is_done() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        seen: list[object] = []

        async def call() -> None:
            seen.append("started")
            seen.append(await fut)

        EagerCall(loop, call()).start()
        assert seen == ["started"]  # before any turn of the loop
        await asyncio.sleep(0)
        assert seen == ["started"]  # waits for its future
        fut.set_result(7)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert seen == ["started", 7]

    asyncio.run(run())


def test_a_call_that_needs_no_wait_ends_in_its_first_step() -> None:
    async def run() -> None:
        done: list[bool] = []

        async def call() -> None:
            done.append(True)

        EagerCall(asyncio.get_running_loop(), call()).start()
        assert done == [True]

    asyncio.run(run())


def test_a_bare_yield_goes_on_at_the_next_turn() -> None:
    async def run() -> None:
        steps: list[int] = []

        async def call() -> None:
            steps.append(1)
            await asyncio.sleep(0)
            steps.append(2)
            await asyncio.sleep(0.001)
            steps.append(3)

        EagerCall(asyncio.get_running_loop(), call()).start()
        assert steps == [1]
        for _ in range(100):
            if len(steps) == 3:
                break
            await asyncio.sleep(0.001)
        assert steps == [1, 2, 3]

    asyncio.run(run())


def test_cancel_while_waiting_cancels_the_future_and_raises_where_it_waits() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        outcome: list[str] = []

        async def call() -> None:
            try:
                await fut
                outcome.append("answered")
            except asyncio.CancelledError:
                outcome.append("cancelled")
                raise

        eager = EagerCall(loop, call())
        eager.start()
        eager.cancel()
        assert fut.cancelled()  # (a proposer skips a command whose future is cancelled)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert outcome == ["cancelled"]

    asyncio.run(run())


def test_cancel_after_the_answer_came_and_before_the_next_step_raises_there() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        outcome: list[object] = []

        async def call() -> None:
            try:
                outcome.append(await fut)
                outcome.append("went on")
            except asyncio.CancelledError:
                outcome.append("cancelled")

        eager = EagerCall(loop, call())
        eager.start()
        fut.set_result(1)  # its wake-up is due at the next turn
        eager.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert outcome == ["cancelled"]

    asyncio.run(run())


def test_each_call_keeps_its_own_context_and_leaves_the_callers_alone() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        futs = [loop.create_future(), loop.create_future()]
        seen: list[tuple[str, str]] = []

        async def call(name: str, fut: asyncio.Future[None]) -> None:
            token = _field.set(name)
            await fut
            seen.append((name, _field.get()))
            _field.reset(token)  # (a token made in another context would raise here)

        for name, fut in zip(("a", "b"), futs, strict=True):
            EagerCall(loop, call(name, fut)).start()
        assert _field.get() == ""
        for fut in reversed(futs):
            fut.set_result(None)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert sorted(seen) == [("a", "a"), ("b", "b")]

    asyncio.run(run())


def test_an_escaping_exception_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        async def call() -> None:
            await fut
            raise RuntimeError("boom")

        EagerCall(loop, call()).start()
        fut.set_result(None)
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR, logger="sqsq.gateway"):
        asyncio.run(run())
    assert any("a stream call failed" in r.message and r.exc_info and
               "boom" in str(r.exc_info[1]) for r in caplog.records)


def test_a_prompt_future_wakes_its_eager_call_in_the_call_that_settles_it() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        seen: list[object] = []
        for settle in ("result", "exception", "cancel"):
            fut = PromptFuture()

            async def call(fut: PromptFuture = fut) -> None:
                try:
                    seen.append(await fut)
                except BaseException as e:  # noqa: BLE001
                    seen.append(type(e).__name__)

            EagerCall(loop, call()).start()
            assert fut.prompt is not None
            if settle == "result":
                fut.set_result(5)
            elif settle == "exception":
                fut.set_exception(ValueError("no"))
            else:
                fut.cancel()
            assert fut.prompt is None  # called once, and let go
        assert seen == [5, "ValueError", "CancelledError"]  # no turn of the loop passed

    asyncio.run(run())


def test_a_task_awaiting_a_prompt_future_is_woken_as_by_any_future() -> None:
    async def run() -> None:
        fut = PromptFuture()
        waiter = asyncio.ensure_future(fut)
        task = asyncio.get_running_loop().create_task(_wait(fut))
        await asyncio.sleep(0)
        fut.set_result(3)
        assert not task.done()  # a task's wake-up is scheduled, never run inside another
        assert await task == 3 and waiter.result() == 3

    asyncio.run(run())


async def _wait(fut: asyncio.Future[int]) -> int:
    return await fut
