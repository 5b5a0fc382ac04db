"""One simulated run by name, seed and mutant: what the command line and the tests fan out
over worker processes (a module of its own, so a spawned worker can import it)."""

from __future__ import annotations

from sqsq.sim.scenarios import SCENARIOS, mutant
from sqsq.sim.world import RunResult, World


def run_one(scenario: str, seed: int, steps: int, mutant_name: str | None = None) -> RunResult:
    if mutant_name is None:
        return World(seed, SCENARIOS[scenario]).run(steps)
    raft, disk, changed = mutant(mutant_name, SCENARIOS[scenario])
    return World(seed, changed, safeguards=raft, disk_safeguards=disk).run(steps)


def replay_command(r: RunResult, steps: int, mutant_name: str | None) -> str:
    extra = f" --mutant {mutant_name}" if mutant_name else ""
    return (f"python -m sqsq.sim --scenario {r.scenario} --seed {r.seed} --steps {steps}"
            f"{extra}")
