"""Where a replicated send's CPU goes: three ``sqsq node`` processes (as the ``sqsq-r3``
target starts them) under cProfile, one workload, then each node's CPU by thread (from
``/proc/<pid>/task``) and the functions that took its event loop's time.

    python -m bench.raftprof [--workload steady-10x100B] [--duration 5] [--top 25]
    python -m bench.raftprof --no-profile   # CPU per message by node and thread only

cProfile sees only a node's main thread (the event loop: the frame server, the engine, the
Raft core and host, the peer transport); the worker threads (fsync, RocksDB writes) show up
in the per-thread CPU. Profiling slows the loop down, so read the profile for shares, and
the bench (``python -m bench --targets sqsq-r3``) for rates.
"""

from __future__ import annotations

import argparse
import os
import pstats
import tempfile
from collections import defaultdict
from pathlib import Path

from bench.runner import run_workload
from bench.systems import SqsqR3
from bench.workloads import catalogue, select

TICK = os.sysconf("SC_CLK_TCK")

# What a node's event loop does for a send, by the function that does it (cumulative time in
# it and what it calls; the rows may nest: the transport's reads step the Raft core).
STAGES = (
    ("client frames in (decode, dispatch)", "gateway/frames.py", "data_received"),
    ("SQS call handling (gRPC service)", "gateway/grpc_service.py", "_stream_call"),
    ("leader's prove (a dry-run apply)", "shard/engine.py", "_proven"),
    ("entry encode", "shard/engine.py", "_encode"),
    ("apply on the loop (small batches)", "shard/statemachine.py", "apply_entry"),
    ("Raft transport: read + step", "shard/peerlink.py", "_cut"),
    ("Raft transport: encode + write", "shard/peers.py", "_flush"),
    ("Raft core step", "raft/node.py", "step"),
    ("Ready loop (ready, hand-offs, sends)", "shard/replica.py", "_run"),
    ("worker-thread hand-offs (to_thread)", "asyncio/threads.py", "to_thread"),
    ("client frames out", "gateway/frames.py", "_flush"),
)


def stages(stats: pstats.Stats) -> list[tuple[str, float, int]]:
    """(stage, cumulative seconds, calls) for each of ``STAGES`` found in the profile."""
    out = []
    for label, path, func in STAGES:
        cum, calls = 0.0, 0
        for (file, _, name), (_, ncalls, _, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
            if name == func and file.endswith(path):
                cum, calls = cum + ct, calls + ncalls
        out.append((label, cum, calls))
    return out


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of one process's event loop (its main thread) and of its other threads
    (asyncio's workers: fsync, RocksDB; gRPC's), summed."""
    out: dict[str, float] = defaultdict(float)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                _, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        name = "loop" if int(tid) == pid else "threads"
        out[name] += (int(fields[11]) + int(fields[12])) / TICK
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="steady-10x100B")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sort", default="tottime")
    ap.add_argument("--no-profile", action="store_true",
                    help="no cProfile (it slows the event loop, not the worker threads, so "
                    "it skews loop against threads): the CPU figures only")
    args = ap.parse_args()
    (w,) = select(catalogue(), args.workload)
    with tempfile.TemporaryDirectory(prefix="sqsq-raftprof-") as tmp:
        system = SqsqR3(profile_dir=None if args.no_profile else Path(tmp))
        spec = system.start(Path(tmp))
        try:
            before = {pid: thread_cpu(pid) for pid in system.pids()}
            result = run_workload(spec, w, duration_s=args.duration,
                                  server_pids=system.pids())
            after = {pid: thread_cpu(pid) for pid in system.pids()}
        finally:
            system.stop()
        head = next(iter(result["ops"]))
        msgs = result["ops"][head]["msgs"]
        print(f"{w.name}: {result['ops'][head]['msgs_per_s']:,} msgs/s ({head}), {msgs} msgs")
        for i, pid in enumerate(system_pids := list(before)):
            used = {k: after[pid].get(k, 0) - before[pid].get(k, 0) for k in after[pid]}
            total = sum(used.values())
            parts = ", ".join(f"{k} {1e6 * v / max(msgs, 1):.0f}" for k, v in
                              sorted(used.items(), key=lambda kv: -kv[1]) if v > 0)
            print(f"node{i} (pid {pid}): {1e6 * total / max(msgs, 1):.0f} us/msg CPU: {parts}")
        del system_pids
        for i in range(0 if args.no_profile else 3):
            path = Path(tmp) / f"node{i}.prof"
            if not path.exists():
                print(f"node{i}: no profile written")
                continue
            stats = pstats.Stats(str(path))
            print(f"\n==== node{i}: {stats.total_tt:.2f} s on the event loop thread (start-up "
                  f"and idle waits included); by stage, us per {head} message:")
            for label, cum, calls in stages(stats):
                print(f"  {label:<40} {1e6 * cum / max(msgs, 1):>8.1f}  ({calls} calls)")
            if args.top:
                stats.sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
