"""What the doors and the router tell Prometheus: requests per action, errors per SQS error
code, latency, requests in progress, calls to the shards retried, NotLeader redirects, and
network mishaps (clients that hang up or send garbage).

Both doors (gRPC and SQS HTTP) report through ``ApiMetrics.request``, so an action counts the
same whichever protocol carried it; the per-request log line is written there too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric

log = logging.getLogger("sqsq.requests")

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                     10.0, 20.0)  # long polls wait up to 20 s
UNKNOWN_ACTION = "unknown"  # what a request naming no action we know is counted as


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry, known_actions: frozenset[str]) -> None:
        # Labels come from a closed set: a client cannot grow the registry by inventing names.
        self.known_actions = known_actions
        self.requests = Counter("sqsq_requests", "Requests answered, by action and protocol.",
                                ["action", "protocol"], registry=registry)
        self.errors = Counter("sqsq_request_errors",
                              "Requests answered with an error, by action and SQS error code.",
                              ["action", "code"], registry=registry)
        self.latency = Histogram("sqsq_request_duration_seconds",
                                 "Time from a request's arrival to its answer, by action.",
                                 ["action"], buckets=LATENCY_BUCKETS_S, registry=registry)
        self.in_progress = Gauge("sqsq_requests_in_progress",
                                 "Requests being handled, by action (long polls included).",
                                 ["action"], registry=registry)
        registry.register(_MishapCollector())
        # Children looked up once (labels() costs a lock and a tuple of strings each call);
        # bounded: actions and protocols come from closed sets.
        self._gauges: dict[str, Any] = {}  # action -> its in-progress gauge
        # (action, protocol) -> its request counter and latency histogram
        self._answered: dict[tuple[str, str], tuple] = {}

    def action_label(self, action: str) -> str:
        return action if action in self.known_actions else UNKNOWN_ACTION

    def request(self, action: str, protocol: str) -> _TimedRequest:
        """Time and count one request (``with``); the body sets ``outcome.code`` when it
        fails."""
        return _TimedRequest(self, self.action_label(action), protocol)

    def gauge(self, label: str) -> Any:
        """The in-progress gauge of one action."""
        found = self._gauges.get(label)
        if found is None:
            found = self._gauges[label] = self.in_progress.labels(action=label)
        return found

    def answered(self, label: str, protocol: str) -> tuple:
        """The request counter and latency histogram of one action and protocol."""
        key = (label, protocol)
        found = self._answered.get(key)
        if found is None:
            found = self._answered[key] = (
                self.requests.labels(action=label, protocol=protocol),
                self.latency.labels(action=label))
        return found


class _TimedRequest:
    """One request under way: counted in progress, then counted and timed when it ends."""

    __slots__ = ("_metrics", "_protocol", "_outcome", "_gauge", "_started")

    def __init__(self, metrics: ApiMetrics, label: str, protocol: str) -> None:
        self._metrics = metrics
        self._protocol = protocol
        self._outcome = RequestOutcome(label)

    def __enter__(self) -> RequestOutcome:
        self._gauge = self._metrics.gauge(self._outcome.action)
        self._gauge.inc()
        self._started = time.perf_counter()
        return self._outcome

    def __exit__(self, *exc_info: object) -> None:
        elapsed = time.perf_counter() - self._started
        self._gauge.dec()
        metrics, outcome = self._metrics, self._outcome
        label = metrics.action_label(outcome.action)  # an HTTP action is known once decoded
        requests, latency = metrics.answered(label, self._protocol)
        requests.inc()
        latency.observe(elapsed)
        if outcome.code:
            metrics.errors.labels(action=label, code=outcome.code).inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s in %.1f ms", label, outcome.code or "OK", elapsed * 1000)


class RequestOutcome:
    __slots__ = ("action", "code")

    def __init__(self, action: str) -> None:
        self.action = action
        self.code = ""  # an SQS error code; empty: it succeeded


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
