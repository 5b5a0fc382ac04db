"""Run one workload against one system: make a queue, preload it, measure, clean up.

Workers are spawned processes (never forked: the parent holds gRPC channels). They connect,
say they are ready, and all start on one signal. Waiting on them is bounded in time; a worker
still alive after that is terminated by its pid.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue as queue_mod
import time
import uuid
from typing import Any

from bench.drivers import make_driver
from bench.loadgen import worker_main
from bench.procs import cpu_seconds
from bench.stats import OpStats, summarize
from bench.workloads import Workload

CTX = mp.get_context("spawn")
READY_TIMEOUT_S = 90.0
PRELOAD_PROCS = 2
PRELOAD_INFLIGHT = 16


def run_phase(spec: dict[str, Any], ref: str, w: Workload, *, mode: str, producers: int,
              consumers: int, duration_s: float, max_msgs: int | None = None,
              batch: int | None = None, hold: bool = False,
              inflight: int | None = None, server_pids: list[int] | None = None,
              gateway_pids: list[int] | None = None) -> dict[str, Any]:
    """Run producers and consumers together; merged per-operation stats, the window, and the
    CPU seconds the workers and (given their pids) the system's processes used meanwhile
    (and, given theirs, its gateways, which are among them)."""
    counters = CTX.Array("q", 2)
    go, ready_q, result_q = CTX.Event(), CTX.Queue(), CTX.Queue()
    jobs = []
    for role, count in (("producer", producers), ("consumer", consumers)):
        for i in range(count):
            share = None
            if max_msgs is not None and role == "producer":
                share = max_msgs // count + (1 if i < max_msgs % count else 0)
            jobs.append({
                "spec": spec, "ref": ref, "role": role, "index": len(jobs), "mode": mode,
                "batch": batch or w.batch, "size": w.size, "fifo_groups": w.fifo_groups,
                "inflight": inflight or w.inflight, "duration_s": duration_s,
                "max_msgs": share, "hold": hold, "wait_s": 1,
            })
    procs = [CTX.Process(target=worker_main, args=(job, counters, go, ready_q, result_q),
                         daemon=True, name=f"bench-{job['role']}-{job['index']}")
             for job in jobs]
    for p in procs:
        p.start()
    results: list[dict[str, Any]] = []
    server_cpu: float | None = None
    gateway_cpu: float | None = None
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for _ in jobs:
            ready_q.get(timeout=max(0.1, deadline - time.monotonic()))
        cpu_before = cpu_seconds(server_pids) if server_pids else None
        gateway_before = cpu_seconds(gateway_pids) if gateway_pids else None
        go_wall = time.time()
        go.set()
        deadline = time.monotonic() + duration_s + 90.0
        for _ in jobs:
            results.append(result_q.get(timeout=max(0.1, deadline - time.monotonic())))
        if cpu_before is not None:
            server_cpu = cpu_seconds(server_pids) - cpu_before
        if gateway_before is not None:
            gateway_cpu = cpu_seconds(gateway_pids) - gateway_before
    except queue_mod.Empty:
        results.append({"error": "a worker did not answer in time"})
        go_wall = time.time()
    finally:
        go.set()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()  # by its pid
                p.join(timeout=5)
    merged = _merge(results, mode, duration_s, go_wall, server_cpu)
    if gateway_cpu is not None:
        merged["cpu_s"]["gateway"] = round(gateway_cpu, 3)
    return merged


def _merge(results: list[dict[str, Any]], mode: str, duration_s: float,
           go_wall: float, server_cpu: float | None = None) -> dict[str, Any]:
    ops: dict[str, OpStats] = {}
    errors = [r["error"] for r in results if "error" in r]
    empty = 0
    wall_last = 0.0
    wall_end = go_wall
    for r in results:
        for name, op in r.get("ops", {}).items():
            ops.setdefault(name, OpStats()).merge(op)
        empty += r.get("empty_receives", 0)
        wall_last = max(wall_last, r.get("wall_last", 0.0))
        wall_end = max(wall_end, r.get("wall_end", go_wall))
    if mode == "recv":  # until the queue was drained, or the time was up
        window = min(duration_s, max(wall_last - go_wall, 1e-3))
    elif mode == "preload":
        window = max(wall_end - go_wall, 1e-3)
    else:
        window = duration_s
    out: dict[str, Any] = {
        "window_s": round(window, 3),
        "ops": {name: summarize(op, window) for name, op in sorted(ops.items())},
        "empty_receives": empty,
        "cpu_s": {"server": None if server_cpu is None else round(server_cpu, 3),
                  "clients": round(sum(r.get("cpu_s", 0.0) for r in results), 3)},
    }
    if errors:
        out["worker_errors"] = errors
    return out


def cpu_per_message(cpu_s: dict[str, float | None], msgs: int) -> dict[str, float | None]:
    """CPU microseconds per headline message, for the system and for the clients."""
    return {side: None if used is None or not msgs else round(used / msgs * 1e6, 1)
            for side, used in cpu_s.items()}


async def _admin(spec: dict[str, Any], action: str, *args: Any) -> Any:
    driver = make_driver(spec, 4)
    await driver.open()
    try:
        return await getattr(driver, action)(*args)
    finally:
        await driver.close()


def admin(spec: dict[str, Any], action: str, *args: Any) -> Any:
    """One administrative call (create/delete queue, depth) from the parent process."""
    return asyncio.run(_admin(spec, action, *args))


def run_workload(spec: dict[str, Any], w: Workload, *, duration_s: float, preload: int = 0,
                 preload_cap_s: float = 60.0, delete_queue: bool = False,
                 server_pids: list[int] | None = None,
                 gateway_pids: list[int] | None = None) -> dict[str, Any]:
    """One workload on a fresh queue: its result as the JSON records it, with the CPU time
    per headline message of the system (its processes: ``server_pids``) and of the clients.

    The queue is left in place unless ``delete_queue``: deleting a large queue makes some
    systems (sqsq among them) collect its garbage in the background, which would slow the
    next workload. Every system is torn down with its data after its last workload.
    """
    name = f"bench-{w.name}-{uuid.uuid4().hex[:8]}".replace(".", "-")
    ref = admin(spec, "create_queue", name, w.fifo)
    out: dict[str, Any] = {"title": w.title, "mode": w.mode, "batch": w.batch, "size": w.size,
                           "fifo_groups": w.fifo_groups, "producers": w.producers,
                           "consumers": w.consumers, "inflight": w.inflight}
    try:
        wanted = w.hold_depth or (preload if w.mode == "recv" else 0)
        if wanted:
            pre = run_phase(spec, ref, w, mode="preload", producers=PRELOAD_PROCS,
                            consumers=0, duration_s=preload_cap_s, max_msgs=wanted, batch=10,
                            inflight=PRELOAD_INFLIGHT)
            send = pre["ops"].get("send", {})
            out["preload"] = {"wanted": wanted, "sent": send.get("msgs", 0),
                              "seconds": pre["window_s"], "msgs_per_s": send.get("msgs_per_s")}
            out["depth_before"] = admin(spec, "depth", ref)
        res = run_phase(spec, ref, w, mode=w.mode, producers=w.producers if w.mode != "recv"
                        else 0, consumers=w.consumers, duration_s=duration_s,
                        hold=bool(w.hold_depth), server_pids=server_pids,
                        gateway_pids=gateway_pids)
        out.update(res)
        if w.hold_depth:
            out["depth_after"] = admin(spec, "depth", ref)
        headline = res["ops"].get(w.headline_op, {})
        out["msgs_per_s"] = headline.get("msgs_per_s", 0.0)
        out["cpu_us_per_msg"] = cpu_per_message(res["cpu_s"], headline.get("msgs", 0))
    finally:
        if delete_queue:
            try:
                admin(spec, "delete_queue", ref)
            except Exception as exc:  # a failed cleanup is noted, not fatal
                out["cleanup_error"] = repr(exc)[:200]
    return out
