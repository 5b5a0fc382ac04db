"""``python -m sqsq.sim``: run scenarios over many seeds; print any failure's replay command."""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from sqsq.sim.runs import replay_command, run_one
from sqsq.sim.scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sqsq.sim", description=__doc__)
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                   help="a scenario to run (repeatable; default: every one)")
    p.add_argument("--seed", type=int, help="run this one seed")
    p.add_argument("--seeds", type=int, default=20, help="seeds per scenario")
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=20_000, help="steps per run")
    p.add_argument("--mutant", help="switch this safeguard off")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    scenarios = args.scenario or sorted(SCENARIOS)
    seeds = [args.seed] if args.seed is not None else list(
        range(args.first_seed, args.first_seed + args.seeds))
    jobs = [(s, seed) for s in scenarios for seed in seeds]
    started = time.monotonic()
    failed = 0
    steps = 0
    spawn = multiprocessing.get_context("spawn")  # a fork can inherit another thread's lock
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=spawn) as pool:
        futures = [pool.submit(run_one, s, seed, args.steps, args.mutant) for s, seed in jobs]
        for n, f in enumerate(futures, 1):
            r = f.result()
            steps += r.steps
            if not r.ok:
                failed += 1
                print(f"FAIL {r.scenario} seed {r.seed}: {len(r.violations)} violation(s)")
                for v in r.violations[:5]:
                    print(f"  {v.kind}: {v.detail}")
                print(f"  replay: {replay_command(r, args.steps, args.mutant)}")
            elif args.seed is not None:
                print(f"ok {r.scenario} seed {r.seed}: {r.steps} steps, {r.sim_ms} ms "
                      f"simulated, {r.stats}")
            if args.seed is None and (n == len(jobs) or jobs[n][0] != r.scenario):
                # (a long run says where it is: the last of a scenario's seeds is done)
                print(f"{r.scenario}: {len(seeds)} seeds done ({n} of {len(jobs)} runs, "
                      f"{time.monotonic() - started:.0f} s, {failed} failed so far)")
            sys.stdout.flush()  # (a run piped to a file shows its failures as they come)
    took = time.monotonic() - started
    print(f"{len(jobs)} runs, {steps} steps in {took:.1f} s: {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
