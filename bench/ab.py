"""Two targets compared in short windows taken in turn, both running the whole time: what a
same-run ratio is worth on a machine whose speed drifts.

    python -m bench.ab --targets sqsq-cluster,sqsq-cluster-4 --workloads send-c1 \
        [--windows 12] [--duration 2]

``python -m bench --rounds N`` runs one target at a time, so a machine that slows down for a
minute (a neighbour's load on a shared host) lands on one target's rounds and not the
other's. Here both targets are started once and stay up; each workload is measured in
``--windows`` pairs of windows, A then B, then B then A, and so on, so the two sides of a
pair are seconds apart and drift falls on both. For each workload it prints each side's
median msgs/s, the median of the pairs' ratios (B / A) and in how many pairs B was ahead
(a ratio whose pairs split both ways is noise, one that holds in nearly every pair is not),
a 95% interval for that median (a bootstrap over the pairs: whether "B at least A" holds or
fails beyond the noise, or the pairs cannot tell), and each side's median CPU time per
message, its own processes and its clients. On a virtual machine the hypervisor can take the
CPU for seconds (``steal`` in ``/proc/stat``: a window at a tenth of its neighbours' rate); the
same figures are printed again over the quiet pairs only, those in which neither window lost
more than ``QUIET_STEAL`` of the machine's time that way.
Each window is a fresh queue, as in ``python -m bench``; the idle target costs the other
what its heartbeats do (a quiet sqsq cluster: a few percent of a core). Workloads that need
a preloaded queue (``recv-*``, ``depth-*``) are not offered.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.cli import warm_up
from bench.procs import stop_on_sigterm
from bench.runner import run_workload
from bench.systems import targets
from bench.workloads import catalogue, select

QUIET_STEAL = 0.01  # the share of a window's CPU time the hypervisor may take, for a quiet pair


def cpu_times() -> list[int]:
    """The machine's CPU time counters: ``/proc/stat``'s first line (user, nice, system,
    idle, iowait, irq, softirq, steal, ...)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def steal_share(before: list[int], after: list[int]) -> float:
    """The share of the machine's CPU time between two readings that the hypervisor gave to
    other guests (guest time is already counted in user, so only the first eight add up)."""
    d = [b - a for a, b in zip(before[:8], after[:8], strict=True)]
    total = sum(d)
    return d[7] / total if len(d) == 8 and total > 0 else 0.0


def quiet(rates: list[tuple[float, float]],
          steals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The pairs in which neither window lost more than ``QUIET_STEAL`` to steal."""
    return [r for r, (sa, sb) in zip(rates, steals, strict=True)
            if sa <= QUIET_STEAL and sb <= QUIET_STEAL]


def pairs(windows: int) -> list[tuple[int, int]]:
    """The order of each pair of windows: (0, 1) then (1, 0), in turn."""
    return [(0, 1) if i % 2 == 0 else (1, 0) for i in range(windows)]


def summary(rates: list[tuple[float, float]]) -> dict[str, Any]:
    """Each side's median msgs/s, the median of the pairs' B / A, the share of pairs in
    which B was ahead, and the median's 95% interval (``low_high``)."""
    ratios = [b / a for a, b in rates if a > 0]
    return {"a": statistics.median(a for a, _ in rates),
            "b": statistics.median(b for _, b in rates),
            "ratio": statistics.median(ratios) if ratios else float("nan"),
            "b_ahead": sum(1 for a, b in rates if b > a) / len(rates),
            "low_high": interval(ratios) if ratios else (float("nan"), float("nan"))}


def interval(ratios: list[float], resamples: int = 2000) -> tuple[float, float]:
    """A 95% interval for the median of the pairs' ratios: the pairs resampled with
    replacement, seeded so that the same pairs always print the same interval."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def cpu_cell(windows: list[tuple[float, float]]) -> str:
    """The median CPU microseconds per message of the system and of its clients."""
    if not windows:
        return "?"
    return (f"{statistics.median(s for s, _ in windows):,.0f} + "
            f"{statistics.median(c for _, c in windows):,.0f}")


def _line(name: str, rates: list[tuple[float, float]]) -> str:
    s = summary(rates)
    low, high = s["low_high"]
    return (f"{name:<16} {s['a']:>16,.0f} {s['b']:>16,.0f}  {s['ratio']:>5.2f}x  "
            f"{s['b_ahead']:>6.0%}  (95%: {low:.2f}-{high:.2f}x)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", required=True, help="two targets: A,B (ratio B / A)")
    ap.add_argument("--workloads", default="send-c1")
    ap.add_argument("--windows", type=int, default=12, help="pairs of windows per workload")
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per window")
    args = ap.parse_args(argv)
    names = [t.strip() for t in args.targets.split(",")]
    known = targets(None)
    if len(names) != 2 or any(n not in known for n in names):
        ap.error(f"--targets takes two of {sorted(known)}")
    workloads = select(catalogue(), args.workloads)
    if any(w.mode == "recv" or w.hold_depth for w in workloads):
        ap.error("recv-* and depth-* workloads need a preloaded queue: use python -m bench")
    with ExitStack() as stack:
        specs, pids = [], []
        for name in names:
            system = known[name]()
            stack.callback(system.stop)
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"sqsq-ab-{name}-"))
            specs.append(system.start(Path(tmp)))
            pids.append(system.pids())
            warm_up(specs[-1])
        print(f"{'workload':<16} {names[0]:>16} {names[1]:>16}  {'B / A':>6}  B ahead  "
              f"(median msgs/s of {args.windows} pairs of {args.duration:g} s windows)")
        for w in workloads:
            rates: list[tuple[float, float]] = []
            steals: list[tuple[float, float]] = []
            cpu: list[list[tuple[float, float]]] = [[], []]
            for order in pairs(args.windows):
                got: dict[int, Any] = {}
                stolen: dict[int, float] = {}
                for side in order:
                    before = cpu_times()
                    res = run_workload(specs[side], w, duration_s=args.duration,
                                       server_pids=pids[side])
                    stolen[side] = steal_share(before, cpu_times())
                    got[side] = res.get("msgs_per_s", 0.0)
                    used = res.get("cpu_us_per_msg") or {}
                    if used.get("server") is not None and used.get("clients") is not None:
                        cpu[side].append((used["server"], used["clients"]))
                rates.append((got[0], got[1]))
                steals.append((stolen[0], stolen[1]))
            print(_line(w.name, rates), flush=True)
            print("  pairs: " + ", ".join(f"{a:,.0f}/{b:,.0f}" for a, b in rates), flush=True)
            print("  steal %: " + ", ".join(f"{100 * a:.0f}/{100 * b:.0f}" for a, b in steals),
                  flush=True)
            calm = quiet(rates, steals)
            print(f"  quiet pairs, {len(calm)} of {len(rates)}: "
                  + (_line("", calm).strip() if calm else "none"), flush=True)
            print("  CPU us per msg, system + clients (median of windows): " + ", ".join(
                f"{name} {cpu_cell(c)}" for name, c in zip(names, cpu, strict=True)), flush=True)
    return 0


if __name__ == "__main__":
    stop_on_sigterm()
    raise SystemExit(main())
