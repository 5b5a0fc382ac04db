"""What the doors and the router tell Prometheus: requests per action, errors per SQS error
code, latency, requests in progress, calls to the shards retried, NotLeader redirects, and
network mishaps (clients that hang up or send garbage).

Both doors (gRPC and SQS HTTP) report through ``ApiMetrics.request``, so an action counts the
same whichever protocol carried it; the per-request log line is written there too.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

log = logging.getLogger("sqsq.requests")

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                     10.0, 20.0)  # long polls wait up to 20 s
UNKNOWN_ACTION = "unknown"  # what a request naming no action we know is counted as


class ApiMetrics:
    """Requests by action and protocol, errors, latency and requests in progress.

    Counted in plain dicts on the event loop and read by a collector at scrape time (which
    exposes them as a Counter, Histogram and Gauge would): a request costs a few dict and
    list updates, not a lock and a label check per sample. The scrape runs in a worker
    thread; it copies each dict in one step (atomic under the GIL) before reading it."""

    def __init__(self, registry: CollectorRegistry, known_actions: frozenset[str]) -> None:
        # Labels come from a closed set: a client cannot grow the registry by inventing names.
        self.known_actions = known_actions
        self.in_progress: dict[str, int] = {}  # action -> requests being handled
        # (action, protocol) -> [requests answered, created]
        self.answered: dict[tuple[str, str], list[float]] = {}
        # action -> [count per bucket (not cumulative; the last is +Inf), sum, created]
        self.latency: dict[str, list[Any]] = {}
        self.errors: dict[tuple[str, str], list[float]] = {}  # (action, code) -> [n, created]
        registry.register(_ApiCollector(self))
        registry.register(_MishapCollector())

    def action_label(self, action: str) -> str:
        return action if action in self.known_actions else UNKNOWN_ACTION

    def request(self, action: str, protocol: str) -> _TimedRequest:
        """Time and count one request (``with``); the body sets ``outcome.code`` when it
        fails."""
        return _TimedRequest(self, self.action_label(action), protocol)

    def begin(self, label: str) -> float:
        """One request under way (``end`` when it is answered): counted in progress. Its
        start, for ``end``. (``request`` without its two objects, for the gRPC calls that
        run by the thousand a second.)"""
        in_progress = self.in_progress
        in_progress[label] = in_progress.get(label, 0) + 1
        return time.perf_counter()

    def end(self, label: str, protocol: str, started: float, code: str,
            answered_as: str | None = None) -> None:
        """The request ``begin`` counted is answered (``code``: its SQS error code, or empty);
        ``answered_as``: the label it is answered as, when it is known only now."""
        elapsed = time.perf_counter() - started
        self.in_progress[label] -= 1
        label = label if answered_as is None else self.action_label(answered_as)
        self.record(label, protocol, elapsed, code)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s in %.1f ms", label, code or "OK", elapsed * 1000)

    def record(self, label: str, protocol: str, elapsed: float, code: str) -> None:
        """One request answered: counted, its latency observed, its error counted."""
        key = (label, protocol)
        answered = self.answered.get(key)
        if answered is None:
            answered = self.answered[key] = [0, time.time()]
        answered[0] += 1
        latency = self.latency.get(label)
        if latency is None:
            latency = self.latency[label] = [[0] * (len(LATENCY_BUCKETS_S) + 1), 0.0,
                                             time.time()]
        latency[0][bisect.bisect_left(LATENCY_BUCKETS_S, elapsed)] += 1  # (le: inclusive)
        latency[1] += elapsed
        if code:
            errors = self.errors.get((label, code))
            if errors is None:
                errors = self.errors[(label, code)] = [0, time.time()]
            errors[0] += 1


class _TimedRequest:
    """One request under way: counted in progress, then counted and timed when it ends."""

    __slots__ = ("_metrics", "_protocol", "_outcome", "_started", "_label")

    def __init__(self, metrics: ApiMetrics, label: str, protocol: str) -> None:
        self._metrics = metrics
        self._protocol = protocol
        self._outcome = RequestOutcome(label)

    def __enter__(self) -> RequestOutcome:
        self._label = self._outcome.action
        self._started = self._metrics.begin(self._label)
        return self._outcome

    def __exit__(self, *exc_info: object) -> None:
        outcome = self._outcome
        # (an HTTP action is known once decoded)
        self._metrics.end(self._label, self._protocol, self._started, outcome.code,
                          outcome.action)


class RequestOutcome:
    __slots__ = ("action", "code")

    def __init__(self, action: str) -> None:
        self.action = action
        self.code = ""  # an SQS error code; empty: it succeeded


_BUCKET_LABELS = [floatToGoString(b) for b in LATENCY_BUCKETS_S] + ["+Inf"]


class _ApiCollector:
    """``ApiMetrics``' counts at scrape time, as its Counter, Histogram and Gauge."""

    def __init__(self, metrics: ApiMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return self._families()

    def collect(self) -> Iterator[Metric]:
        yield from self._families()

    def _families(self) -> list[Metric]:
        m = self._metrics
        requests = CounterMetricFamily("sqsq_requests",
                                       "Requests answered, by action and protocol.",
                                       labels=["action", "protocol"])
        for (action, protocol), (n, created) in sorted(list(m.answered.items())):
            requests.add_metric([action, protocol], n, created=created)
        errors = CounterMetricFamily(
            "sqsq_request_errors",
            "Requests answered with an error, by action and SQS error code.",
            labels=["action", "code"])
        for (action, code), (n, created) in sorted(list(m.errors.items())):
            errors.add_metric([action, code], n, created=created)
        latency = HistogramMetricFamily(
            "sqsq_request_duration_seconds",
            "Time from a request's arrival to its answer, by action.", labels=["action"])
        for action, (counts, total, created) in sorted(list(m.latency.items())):
            cumulative, buckets = 0, []
            for le, n in zip(_BUCKET_LABELS, list(counts), strict=True):
                cumulative += n
                buckets.append((le, cumulative))
            latency.add_metric([action], buckets, total)
            latency.samples.append(Sample("sqsq_request_duration_seconds_created",
                                          {"action": action}, created))
        in_progress = GaugeMetricFamily(
            "sqsq_requests_in_progress",
            "Requests being handled, by action (long polls included).", labels=["action"])
        for action, n in sorted(list(m.in_progress.items())):
            in_progress.add_metric([action], n)
        return [requests, errors, latency, in_progress]


class RoutingMetrics:
    """The gateway's calls to shard leaders: attempts retried, NotLeader redirects, and
    message calls passed through to their shard as they came (not decoded here)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.retries = Counter("sqsq_gateway_shard_retries",
                               "Calls to a shard retried (on another node or after a wait).",
                               ["shard"], registry=registry)
        self.redirects = Counter("sqsq_gateway_not_leader_redirects",
                                 "Calls a node answered NotLeader, followed to the leader.",
                                 ["shard"], registry=registry)
        self.passed_through = Counter(
            "sqsq_gateway_passed_through",
            "gRPC message calls for one shard passed to it as they came, by action.",
            ["action"], registry=registry)
        self._passed: dict[str, Any] = {}  # action -> its counter (closed set: 7 actions)

    def passed(self, action: str) -> None:
        found = self._passed.get(action)
        if found is None:
            found = self._passed[action] = self.passed_through.labels(action=action)
        found.inc()

    def retried(self, shard_id: int, not_leader: bool) -> None:
        shard = str(shard_id)
        self.retries.labels(shard=shard).inc()
        if not_leader:
            self.redirects.labels(shard=shard).inc()


class _MishapCollector:
    """``quietlog``'s count of network mishaps, read at scrape time."""

    def collect(self) -> Iterator[Metric]:
        from sqsq.gateway.http import quietlog  # here: the HTTP front imports this module

        family = CounterMetricFamily(
            "sqsq_client_mishaps",
            "Clients that hung up mid-request or sent malformed HTTP, by kind.",
            labels=["kind"])
        for kind, n in sorted(quietlog.COUNTS.items()):
            family.add_metric([kind], n)
        yield family
