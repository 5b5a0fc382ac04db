"""Per-operation counters and latency samples, merged across processes."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

SAMPLE_CAP = 200_000  # latency samples kept per operation per process (reservoir beyond)


@dataclass
class OpStats:
    calls: int = 0
    msgs: int = 0
    errors: int = 0
    first_error: str = ""
    seen: int = 0  # calls offered to the reservoir
    samples: list[float] = field(default_factory=list)  # seconds

    def record(self, latency_s: float, msgs: int) -> None:
        self.calls += 1
        self.msgs += msgs
        self.seen += 1
        if len(self.samples) < SAMPLE_CAP:
            self.samples.append(latency_s)
        else:
            j = random.randrange(self.seen)
            if j < SAMPLE_CAP:
                self.samples[j] = latency_s

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{type(exc).__name__}: {exc}"[:300]

    def merge(self, other: OpStats) -> None:
        self.calls += other.calls
        self.msgs += other.msgs
        self.errors += other.errors
        self.first_error = self.first_error or other.first_error
        self.seen += other.seen
        self.samples.extend(other.samples)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def summarize(op: OpStats, window_s: float) -> dict[str, Any]:
    """The JSON shape of one operation's result."""
    values = sorted(op.samples)
    window = max(window_s, 1e-9)
    out: dict[str, Any] = {
        "msgs": op.msgs,
        "calls": op.calls,
        "msgs_per_s": round(op.msgs / window, 1),
        "calls_per_s": round(op.calls / window, 1),
        "p50_ms": round(percentile(values, 0.50) * 1000, 3),
        "p99_ms": round(percentile(values, 0.99) * 1000, 3),
        "p999_ms": round(percentile(values, 0.999) * 1000, 3),
        "errors": op.errors,
    }
    if op.first_error:
        out["first_error"] = op.first_error
    return out
