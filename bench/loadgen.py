"""One load-generating worker process: ``inflight`` concurrent producer or consumer loops.

Every loop is bounded by the deadline, and producers also by a message budget. Operations
that complete after the deadline are not counted. Depth tests (``hold``) gate producers on
the shared sent/deleted counters so the backlog stays where the preload put it.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from bench.drivers import make_driver
from bench.stats import OpStats

HOLD_SLACK = 2_000  # depth tests: messages producers may be ahead of consumers
GO_TIMEOUT_S = 180.0


class _State:
    def __init__(self, job: dict[str, Any], counters: Any) -> None:
        self.job = job
        self.counters = counters
        self.budget: int | None = job.get("max_msgs")
        self.ops: dict[str, OpStats] = {}
        self.empty_receives = 0
        self.wall_last = 0.0  # wall time of the last counted consumer delete

    def op(self, name: str) -> OpStats:
        return self.ops.setdefault(name, OpStats())

    def add(self, index: int, n: int) -> None:
        if self.counters is not None:
            with self.counters.get_lock():
                self.counters[index] += n

    def backlog(self) -> int:
        return self.counters[0] - self.counters[1] if self.counters is not None else 0


async def _producer(driver: Any, st: _State, deadline: float) -> None:
    job = st.job
    body = "x" * job["size"]
    groups_n = job.get("fifo_groups", 0)
    hold = job.get("hold", False)
    ref = job["ref"]
    while time.perf_counter() < deadline:
        n = job["batch"]
        if st.budget is not None:
            if st.budget <= 0:
                return
            n = min(n, st.budget)
            st.budget -= n
        while hold and st.backlog() >= HOLD_SLACK and time.perf_counter() < deadline:
            await asyncio.sleep(0.002)
        groups: list[str | None] = (
            [f"g{random.randrange(groups_n)}" for _ in range(n)] if groups_n else [None] * n)
        t = time.perf_counter()
        try:
            await driver.send(ref, [body] * n, groups)
        except Exception as exc:  # counted, then the loop goes on (bounded by the deadline)
            st.op("send").error(exc)
            await asyncio.sleep(0.01)
            continue
        done = time.perf_counter()
        if done <= deadline or st.budget is not None:
            st.op("send").record(done - t, n)
            st.add(0, n)


async def _consumer(driver: Any, st: _State, deadline: float) -> None:
    job = st.job
    ref = job["ref"]
    drain = job["mode"] == "recv"
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        try:
            msgs = await driver.receive(ref, job["batch"], job.get("wait_s", 1))
        except Exception as exc:
            st.op("receive").error(exc)
            await asyncio.sleep(0.01)
            continue
        done = time.perf_counter()
        if not msgs:
            st.empty_receives += 1
            if drain:
                return  # a preloaded queue with nothing visible left: drained
            continue
        if done <= deadline:
            st.op("receive").record(done - t, len(msgs))
        t = time.perf_counter()
        try:
            await driver.delete(ref, msgs)
        except Exception as exc:
            st.op("delete").error(exc)
            continue
        done = time.perf_counter()
        if done <= deadline:
            st.op("delete").record(done - t, len(msgs))
            st.wall_last = time.time()
            st.add(1, len(msgs))


async def _run(job: dict[str, Any], counters: Any, go: Any, ready_q: Any) -> dict[str, Any]:
    driver = make_driver(job["spec"], job["inflight"])
    await driver.open()
    try:
        ready_q.put(job["index"])
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, go.wait, GO_TIMEOUT_S):
            raise TimeoutError("never told to start")
        st = _State(job, counters)
        cpu_start = time.process_time()  # this process, all its threads (gRPC's included)
        wall_start = time.time()
        deadline = time.perf_counter() + job["duration_s"]
        loop_fn = _producer if job["role"] == "producer" else _consumer
        await asyncio.gather(*(loop_fn(driver, st, deadline) for _ in range(job["inflight"])))
        return {"role": job["role"], "ops": st.ops, "wall_start": wall_start,
                "wall_end": time.time(), "wall_last": st.wall_last,
                "empty_receives": st.empty_receives,
                "cpu_s": time.process_time() - cpu_start}
    finally:
        await driver.close()


def worker_main(job: dict[str, Any], counters: Any, go: Any, ready_q: Any,
                result_q: Any) -> None:
    """Process entry point: run the job, put its result (or its error) on ``result_q``."""
    try:
        result = asyncio.run(_run(job, counters, go, ready_q))
    except BaseException as exc:  # reported to the parent, which counts the worker as failed
        result = {"role": job.get("role"), "error": f"{type(exc).__name__}: {exc}"[:500]}
        ready_q.put(job.get("index"))  # do not leave the parent waiting for this one
    result_q.put(result)
