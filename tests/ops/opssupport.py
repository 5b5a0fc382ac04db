"""Reading a process's operations port the way Prometheus and an orchestrator do."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]


class Scrape:
    """One scrape, parsed: samples by name and labels."""

    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: dict[tuple[str, Labels], float] = {}
        for family in self.families.values():
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def value(self, name: str, default: float | None = None, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        if key not in self.samples:
            if default is not None:
                return default
            raise AssertionError(f"no sample {name}{labels}")
        return self.samples[key]

    def where(self, name: str, **labels: str) -> dict[Labels, float]:
        """Every sample of ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return {lab: v for (n, lab), v in self.samples.items() if n == name and want <= lab}

    def names(self) -> set[str]:
        """Every name a query may use: families, their samples' names, and the suffixed names
        of a family declared with no sample yet (a labelled counter nothing has counted)."""
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
        declared = {f.name + s for f in self.families.values()
                    for s in suffixes.get(f.type, ())}
        return set(self.families) | declared | {n for n, _ in self.samples}


def scrape(base_url: str) -> Scrape:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as r:
        return Scrape(r.read().decode())


def readyz(base_url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"{base_url}/readyz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def until(what: str, check: Callable[[], object], timeout_s: float = 30.0,
          every_s: float = 0.1) -> object:
    """``check()`` once it is truthy, polled up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")
