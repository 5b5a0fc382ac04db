"""``python -m bench``: run workloads against targets, print the table, write JSON and PNGs.

    python -m bench                                # sqsq-grpc, every workload, 3 s each
    python -m bench --all                          # every target (starts the peers)
    python -m bench --all --quick                  # a short full run
    python -m bench --targets sqsq-grpc,nats-r3 --workloads send-10x100B --duration 5
    python -m bench --targets sqsq-grpc,nats-r3 --workloads send-1x100B --rounds 3

With ``--rounds N`` every target runs every workload N times, the targets in turn (forward,
then backward, ...); each cell of the tables is the round with the median headline rate
(for an even N the lower of the two middle ones), and a table shows every round's rate. On
a shared machine one 5-second window can be 30% off (the same code measured 5,808 and 7,795
msgs/s in one run, at two places in the order).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import report
from bench.runner import run_workload
from bench.systems import NOT_DURABLE, Skip, keep_logs, targets
from bench.workloads import Workload, catalogue, scaled, select

RATE_HINT = "send-10x100B"  # its rate sizes the preloads of the receive workloads


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="sqsq-grpc",
                   help="comma-separated targets (see --list); default sqsq-grpc")
    p.add_argument("--all", action="store_true", help="every target")
    p.add_argument("--workloads", default="", help="comma-separated workloads (default all)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds of measurement per workload (default 3, --quick 1)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run everything this many times, targets in turn; report the median")
    p.add_argument("--quick", action="store_true",
                   help="a short full run: 1 s per workload, smaller preloads and depth test")
    p.add_argument("--deep-depth", type=int, default=None,
                   help="messages kept waiting in the deep depth test (default 1,000,000; "
                        "--quick 20,000)")
    p.add_argument("--depth-targets", default="sqsq-grpc",
                   help="targets that run the depth tests (default sqsq-grpc)")
    p.add_argument("--preload-cap", type=float, default=None,
                   help="seconds a preload may take at most (default 240, --quick 30); a "
                        "preload cut short is reported with the depth it reached")
    p.add_argument("--producers", type=int, default=None, help="producer processes")
    p.add_argument("--consumers", type=int, default=None, help="consumer processes")
    p.add_argument("--inflight", type=int, default=None, help="requests in flight per process")
    p.add_argument("--sqsq-endpoint", default=None,
                   help="use a running sqsq server (host:port) instead of starting one")
    p.add_argument("--out", type=Path, default=Path("bench-results"),
                   help="directory for result.json and the PNG charts")
    p.add_argument("--delete-queues", action="store_true",
                   help="delete each workload's queue after it (default: keep them until the "
                        "system is torn down, so no background cleanup slows the next one)")
    p.add_argument("--no-chart", action="store_true", help="skip the PNG charts")
    p.add_argument("--list", action="store_true", help="list targets and workloads, then exit")
    p.add_argument("--render", type=Path, default=None, metavar="RESULT_JSON",
                   help="print an earlier result as markdown tables (and redraw its charts "
                        "into --out), without running anything")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    args.duration = args.duration or (1.0 if args.quick else 3.0)
    args.deep_depth = args.deep_depth or (20_000 if args.quick else 1_000_000)
    args.preload_cap = args.preload_cap or (30.0 if args.quick else 240.0)
    return args


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "platform": platform.platform(),
            "python": platform.python_version()}


def _preload_for(done: dict[str, Any], duration: float, cap: float) -> int:
    hint = done.get(RATE_HINT, {}).get("msgs_per_s") or 5_000.0
    return int(max(min(hint * duration * 1.5, hint * cap * 0.5, 500_000), 200))


def run_target(name: str, make: Any, args: argparse.Namespace, workloads: list,
               result: dict[str, Any], out_json: Path, save: dict[str, Any] | None = None,
               ) -> None:
    """Run every workload on one target into ``result``; after each, write ``save`` (the
    whole run; ``result`` itself by default) to ``out_json``."""
    system = make()
    entry: dict[str, Any] = {"durability": system.durability, "version": system.version(),
                             "workloads": {}}
    result["targets"][name] = entry
    depth_targets = set(args.depth_targets.split(","))
    with tempfile.TemporaryDirectory(prefix=f"sqsq-bench-{name}-") as tmp:
        try:
            spec = system.start(Path(tmp))
        except Exception as exc:  # skipped, or failed to start: the run goes on
            system.stop()
            kept = keep_logs(Path(tmp), args.out / "failed-starts" / f"{name}-{_stamp()}")
            status = "skipped" if isinstance(exc, Skip) else "failed"
            entry.update(status=status, reason=f"{type(exc).__name__}: {exc}"[:2000]
                         if status == "failed" else str(exc))
            print(f"== {name}: {status}: {entry['reason']}", flush=True)
            if kept is not None:
                entry["logs"] = str(kept)
                print(f"   its logs are kept in {kept}", flush=True)
            return
        entry["status"] = "ok"
        entry["loadavg_at_start"] = os.getloadavg()
        print(f"== {name} ({entry['version']}): {system.durability}", flush=True)
        try:
            warm_up(spec)
            for w in workloads:
                w = scaled(w, args.producers, args.consumers, args.inflight)
                if w.fifo and not system.supports_fifo:
                    entry["workloads"][w.name] = {"skipped": "no per-group FIFO in this system"}
                    continue
                if w.hold_depth and name not in depth_targets:
                    continue
                t0 = time.monotonic()
                try:
                    res = run_workload(spec, w, duration_s=args.duration,
                                       preload=_preload_for(entry["workloads"], args.duration,
                                                            args.preload_cap),
                                       preload_cap_s=args.preload_cap,
                                       delete_queue=args.delete_queues,
                                       server_pids=system.pids(),
                                       gateway_pids=system.gateway_pids())
                except Exception as exc:  # recorded; the run goes on with the next workload
                    res = {"mode": w.mode, "failed": f"{type(exc).__name__}: {exc}"[:300],
                           "msgs_per_s": 0.0, "ops": {}}
                res["wall_s"] = round(time.monotonic() - t0, 1)
                entry["workloads"][w.name] = res
                _print_line(name, w.name, res)
                report.write_json(save or result, out_json)
        finally:
            system.stop()


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def warm_up(spec: dict[str, Any]) -> None:
    """A second of unrecorded batched sends, so the first workload does not pay for startup."""
    try:
        run_workload(spec, Workload("warmup", "send", consumers=0), duration_s=1.0)
    except Exception as exc:
        print(f"  warm-up failed: {exc!r}", flush=True)


def _print_line(target: str, wname: str, res: dict[str, Any]) -> None:
    ops = "  ".join(f"{op} {s['msgs_per_s']:,.0f}/s p50 {s['p50_ms']:.2f} p99 {s['p99_ms']:.2f}"
                    f" p999 {s['p999_ms']:.2f} ms" + (f" ERR {s['errors']}" if s["errors"] else "")
                    for op, s in res.get("ops", {}).items())
    extra = ""
    if "preload" in res:
        extra = f"  [preloaded {res['preload']['sent']:,} in {res['preload']['seconds']}s]"
    cpu = report.cpu_cell(res)
    if cpu is not None:
        extra += f"  [CPU us/msg, system + clients: {cpu}]"
    if res.get("worker_errors"):
        extra += f"  WORKER ERRORS: {res['worker_errors'][:2]}"
    if res.get("failed"):
        extra += f"  FAILED: {res['failed']}"
    print(f"  {target:16} {wname:18} {ops}{extra}", flush=True)


def chosen(known: list[str], everything: bool, asked: str) -> list[str]:
    """The targets to run: those ``asked`` for (comma-separated), or with ``everything``
    every durable one (a target without fsync runs only when asked for by name)."""
    if everything:
        return [n for n in known if not n.endswith(NOT_DURABLE)]
    return [t.strip() for t in asked.split(",")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    all_targets = targets(args.sqsq_endpoint)
    workloads = select(catalogue(args.deep_depth), args.workloads)
    if args.render:
        import json

        old = json.loads(args.render.read_text())
        print(report.render(old, markdown=True))
        if not args.no_chart:
            args.out.mkdir(parents=True, exist_ok=True)
            for path in report.charts(old, args.out):
                print(f"chart: {path}")
        return 0
    if args.list:
        print("targets:   " + ", ".join(all_targets))
        print("workloads:\n" + "\n".join(f"  {w.name:18} {w.title}" for w in workloads))
        return 0
    names = chosen(list(all_targets), args.all, args.targets)
    unknown = [n for n in names if n not in all_targets]
    if unknown:
        print(f"unknown target(s) {unknown}; known: {list(all_targets)}", file=sys.stderr)
        return 2
    out_json = args.out / "result.json"
    result: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(), "duration_s": args.duration, "targets": {},
    }
    t0 = time.monotonic()
    if args.rounds == 1:
        for name in names:
            run_target(name, all_targets[name], args, workloads, result, out_json)
    else:
        result["rounds"] = []
        for i in range(args.rounds):
            this: dict[str, Any] = {"targets": {}}
            result["rounds"].append(this)
            print(f"==== round {i + 1} of {args.rounds}", flush=True)
            for name in names if i % 2 == 0 else names[::-1]:
                run_target(name, all_targets[name], args, workloads, this, out_json, result)
        result["targets"] = report.median_of_rounds(result["rounds"], names)
    result["total_s"] = round(time.monotonic() - t0, 1)
    report.write_json(result, out_json)
    print("\n" + report.render(result))
    print(f"\nJSON: {out_json}")
    if not args.no_chart:
        for path in report.charts(result, args.out):
            print(f"chart: {path}")
    return 0
