"""The console's pieces without a browser: the depth history, the chart's geometry, and how a
partitioned queue's peeks merge."""

from __future__ import annotations

import pytest

from sqsq.core.peek import Peek, PeekedMessage
from sqsq.gateway.console import sampler
from sqsq.gateway.console.chart import depth_chart
from sqsq.gateway.console.sampler import DepthHistory, Sample
from sqsq.gateway.console.sources import merge_peeks


def test_history_keeps_an_hour_per_existing_queue() -> None:
    h = DepthHistory(interval_s=600.0)  # an hour is 7 samples (both ends)
    assert h.capacity == 7
    for i in range(10):
        h.record({"a": (i, 0, 0), "b": (0, i, 0)}, at_s=i * 600.0)
    assert [s.visible for s in h.samples("a")] == [3, 4, 5, 6, 7, 8, 9]
    assert [s.visible for s in h.samples("a", since_s=8 * 600.0)] == [8, 9]
    h.record({"a": (1, 2, 3)}, at_s=6000.0)  # b was deleted: its history goes
    assert h.samples("b") == [] and h.samples("a")[-1] == Sample(6000.0, 1, 2, 3)


def test_sampling_interval_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sampler.ENV_INTERVAL, raising=False)
    assert sampler.interval_from_env() == sampler.DEFAULT_INTERVAL_S
    monkeypatch.setenv(sampler.ENV_INTERVAL, "2.5")
    assert sampler.interval_from_env() == 2.5
    for bad in ("soon", "0", "7200"):
        monkeypatch.setenv(sampler.ENV_INTERVAL, bad)
        with pytest.raises(ValueError, match=sampler.ENV_INTERVAL):
            sampler.interval_from_env()


def test_chart_scales_to_the_samples() -> None:
    samples = [Sample(1000.0 + 10 * i, visible=i, in_flight=7, delayed=0) for i in range(13)]
    chart = depth_chart(samples, now_s=1120.0)
    visible, in_flight, delayed = chart.lines
    left, top, right, bottom = chart.plot
    xs = [float(p.split(",")[0]) for p in visible.points.split()]
    ys = [float(p.split(",")[1]) for p in visible.points.split()]
    # two minutes of samples fill the width, oldest at the left, newest at "now"
    assert xs[0] == left and xs[-1] == right and xs == sorted(xs)
    # 12 messages at most: the axis goes to 20; 0 is the bottom
    assert [label for _, label in chart.y_ticks] == ["0", "10", "20"]
    assert ys[0] == bottom and ys == sorted(ys, reverse=True)
    assert (visible.last, in_flight.last, delayed.last) == (12, 7, 0)
    assert {p.split(",")[1] for p in delayed.points.split()} == {str(float(bottom))}
    assert chart.x_ticks[0][1] == "-2 min" and chart.x_ticks[-1][1] == "now"
    empty = depth_chart([], now_s=1120.0)
    assert empty.samples == 0 and all(line.points == "" for line in empty.lines)


def _message(mid: str, sent_ms: int) -> PeekedMessage:
    return PeekedMessage(mid, mid, False, sent_ms, "visible", 0, 0)


def test_partition_peeks_merge_oldest_first() -> None:
    a = Peek((_message("a1", 10), _message("a2", 40)), 10, 100)
    b = Peek((_message("b1", 20), _message("b2", 30)), 20, 105)
    empty = Peek((), None, 99)
    merged = merge_peeks([a, b, empty], 3)
    assert [m.message_id for m in merged.messages] == ["a1", "b1", "b2"]
    assert merged.oldest_sent_ms == 10 and merged.now_ms == 105
    assert merge_peeks([empty], 10) == Peek((), None, 99)
