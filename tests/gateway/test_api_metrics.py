"""The request metrics are counted in plain dicts and exposed at scrape time: what a scrape
reads is what prometheus_client's own Counter, Histogram and Gauge would say for the same
requests (names, labels, cumulative buckets with inclusive bounds, counts and sums)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sqsq.gateway.metrics import LATENCY_BUCKETS_S, ApiMetrics

# (action, protocol, seconds, SQS error code): bucket bounds exactly, between, past the last
REQUESTS = [("SendMessage", "grpc", 0.001, ""), ("SendMessage", "grpc", 0.0011, ""),
            ("SendMessage", "http", 0.25, "QueueDoesNotExist"),
            ("ReceiveMessage", "grpc", 20.0, ""), ("ReceiveMessage", "grpc", 25.0, "")]


def _samples(registry: CollectorRegistry) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.startswith("sqsq_request") and not s.name.endswith("_created"):
                out[(s.name, tuple(sorted(s.labels.items())))] = round(s.value, 9)
    return out


def test_a_scrape_reads_what_prometheus_clients_own_metrics_would() -> None:
    ours = CollectorRegistry()
    metrics = ApiMetrics(ours, frozenset({"SendMessage", "ReceiveMessage"}))
    for action, protocol, seconds, code in REQUESTS:
        metrics.record(action, protocol, seconds, code)
    with metrics.request("ReceiveMessage", "grpc"):  # one still under way when scraped
        got = _samples(ours)

    theirs = CollectorRegistry()
    requests = Counter("sqsq_requests", "", ["action", "protocol"], registry=theirs)
    errors = Counter("sqsq_request_errors", "", ["action", "code"], registry=theirs)
    latency = Histogram("sqsq_request_duration_seconds", "", ["action"],
                        buckets=LATENCY_BUCKETS_S, registry=theirs)
    in_progress = Gauge("sqsq_requests_in_progress", "", ["action"], registry=theirs)
    for action, protocol, seconds, code in REQUESTS:
        requests.labels(action=action, protocol=protocol).inc()
        latency.labels(action=action).observe(seconds)
        if code:
            errors.labels(action=action, code=code).inc()
    in_progress.labels(action="ReceiveMessage").inc()
    assert got == _samples(theirs)
    assert got[("sqsq_request_duration_seconds_bucket",
                (("action", "SendMessage"), ("le", "0.001")))] == 1  # the bound is inclusive


def test_requests_in_progress_go_back_to_zero() -> None:
    registry = CollectorRegistry()
    metrics = ApiMetrics(registry, frozenset({"SendMessage"}))
    with metrics.request("SendMessage", "grpc") as outcome:
        outcome.code = "InvalidParameterValue"
    with metrics.request("", "http") as outcome:  # an HTTP action named once decoded
        outcome.action = "SendMessage"
    got = _samples(registry)
    assert got[("sqsq_requests_in_progress", (("action", "SendMessage"),))] == 0
    assert got[("sqsq_requests_in_progress", (("action", "unknown"),))] == 0
    assert got[("sqsq_requests_total", (("action", "SendMessage"), ("protocol", "http")))] == 1
    assert got[("sqsq_request_errors_total",
                (("action", "SendMessage"), ("code", "InvalidParameterValue")))] == 1
