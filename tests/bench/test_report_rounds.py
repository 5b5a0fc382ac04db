"""``python -m bench --rounds N``: each table cell is the round with the median headline rate,
whole (its latencies and CPU figures with it), and every round's rate is shown beside."""

from __future__ import annotations

import pytest

from bench import cli, report


def _round(rates: dict[str, float], p50: dict[str, float]) -> dict:
    return {"targets": {
        name: {"status": "ok", "durability": "d", "version": "v", "workloads": {
            "send-1x100B": {"msgs_per_s": rate, "ops": {"send": {
                "msgs_per_s": rate, "p50_ms": p50[name], "p99_ms": 9.0, "p999_ms": 9.0,
                "errors": 0}}},
            "fifo1-10x100B": {"skipped": "no per-group FIFO in this system"},
        }} for name, rate in rates.items()}}


def test_each_cell_is_the_whole_median_round_and_every_round_is_listed() -> None:
    rounds = [_round({"sqsq-grpc": 7000.0, "nats-r3": 9000.0}, {"sqsq-grpc": 1.0, "nats-r3": 2.0}),
              _round({"sqsq-grpc": 5000.0, "nats-r3": 7000.0}, {"sqsq-grpc": 3.0, "nats-r3": 4.0}),
              _round({"sqsq-grpc": 8000.0, "nats-r3": 6000.0}, {"sqsq-grpc": 5.0, "nats-r3": 6.0})]
    combined = report.median_of_rounds(rounds, ["sqsq-grpc", "nats-r3"])
    sqsq = combined["sqsq-grpc"]["workloads"]["send-1x100B"]
    assert sqsq["msgs_per_s"] == 7000.0
    assert sqsq["ops"]["send"]["p50_ms"] == 1.0  # from the same round as the rate
    assert sqsq["rounds_msgs_per_s"] == [7000.0, 5000.0, 8000.0]
    assert combined["nats-r3"]["workloads"]["send-1x100B"]["msgs_per_s"] == 7000.0
    assert "skipped" in combined["nats-r3"]["workloads"]["fifo1-10x100B"]

    text = report.render({"targets": combined})
    assert "7,000 / 5,000 / 8,000" in text
    assert "9,000 / 7,000 / 6,000" in text
    assert "1.00x" in text  # the ratio of the two medians


def test_an_even_count_takes_the_lower_middle_round() -> None:
    rounds = [_round({"sqsq-grpc": r}, {"sqsq-grpc": r / 1000}) for r in (6000.0, 9000.0)]
    combined = report.median_of_rounds(rounds, ["sqsq-grpc"])
    assert combined["sqsq-grpc"]["workloads"]["send-1x100B"]["msgs_per_s"] == 6000.0


def test_rounds_must_be_positive() -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--rounds", "0"])
