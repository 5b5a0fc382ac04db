"""The depth chart's geometry: the last hour's samples as SVG polylines, drawn by the queue
page's template (numbers only here: the template escapes what it prints). The time axis spans
the hour, or less while the process has sampled for less (at least a minute), so a fresh
process's chart is not a sliver at the right edge."""

from __future__ import annotations

from dataclasses import dataclass

from sqsq.gateway.console.sampler import HISTORY_S, Sample

WIDTH, HEIGHT = 720, 200
MIN_SPAN_S = 60.0
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 10, 24  # margins for the axes' labels


@dataclass(frozen=True)
class Line:
    label: str
    css: str
    points: str  # "x,y x,y ..." in SVG user units
    last: int  # the latest sample's value


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    lines: tuple[Line, ...]
    y_ticks: tuple[tuple[float, str], ...]
    x_ticks: tuple[tuple[float, str], ...]
    samples: int
    plot: tuple[int, int, int, int]  # left, top, right, bottom of the plot area


def _nice_ceiling(n: int) -> int:
    """The smallest of 1, 2, 5 x 10^k at or above ``n`` (at least 1)."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if m * step >= n:
                return m * step
        step *= 10


def _ago(seconds: float) -> str:
    if seconds <= 0:
        return "now"
    return f"-{seconds:.0f} s" if seconds < 120 else f"-{seconds / 60:.0f} min"


def depth_chart(samples: list[Sample], now_s: float) -> Chart:
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    top = _nice_ceiling(max((max(s.visible, s.in_flight, s.delayed) for s in samples),
                            default=1))

    span_s = min(HISTORY_S, max(MIN_SPAN_S, now_s - samples[0].at_s if samples else 0.0))

    def x(at_s: float) -> float:
        return round(x1 - (now_s - at_s) / span_s * (x1 - x0), 1)

    def y(value: int) -> float:
        return round(y1 - value / top * (y1 - y0), 1)

    lines = []
    for label, css, field in (("visible", "visible", "visible"),
                              ("in flight", "inflight", "in_flight"),
                              ("delayed", "delayed", "delayed")):
        points = " ".join(f"{x(s.at_s)},{y(getattr(s, field))}" for s in samples)
        lines.append(Line(label, css, points, getattr(samples[-1], field) if samples else 0))
    y_ticks = tuple((y(v), str(v)) for v in sorted({0, top // 2, top}))
    x_ticks = tuple((x(now_s - span_s * f), _ago(span_s * f)) for f in (1, .75, .5, .25, 0))
    return Chart(WIDTH, HEIGHT, tuple(lines), y_ticks, x_ticks, len(samples), (x0, y0, x1, y1))
