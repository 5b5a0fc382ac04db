"""``python -m bench.ab``: two targets measured in pairs of windows taken in turn, A first then
B first, and a ratio read from the pairs, not from two separate runs."""

from __future__ import annotations

import pytest

from bench import ab


def test_the_pairs_take_turns_at_going_first() -> None:
    assert ab.pairs(4) == [(0, 1), (1, 0), (0, 1), (1, 0)]


def test_the_ratio_is_the_median_of_the_pairs_and_drift_falls_on_both_sides() -> None:
    # the machine halves its speed half way: the pairs' ratios stay at 1.1
    rates = [(1000.0, 1100.0), (1000.0, 1100.0), (500.0, 550.0), (500.0, 550.0), (500.0, 550.0)]
    s = ab.summary(rates)
    assert s["ratio"] == pytest.approx(1.1)
    assert (s["a"], s["b"]) == (500.0, 550.0)
    assert s["b_ahead"] == 1.0
    split = ab.summary([(100.0, 90.0), (100.0, 120.0), (100.0, 80.0), (100.0, 110.0)])
    assert split["b_ahead"] == 0.5


def test_the_interval_says_whether_the_pairs_can_tell_the_two_apart() -> None:
    ahead = [1.04, 1.06, 1.05, 1.07, 1.03, 1.05, 1.06, 1.04, 1.05, 1.06]
    low, high = ab.interval(ahead)
    assert 1.0 < low <= ab.statistics.median(ahead) <= high < 1.1
    split = [0.9, 1.1, 0.95, 1.08, 0.92, 1.05, 0.97, 1.02, 0.93, 1.06]
    low, high = ab.interval(split)
    assert low < 1.0 < high
    assert ab.interval(split) == (low, high)  # the same pairs print the same interval
    assert ab.summary([(100.0, 105.0)] * 4)["low_high"] == (1.05, 1.05)


def test_a_pair_is_quiet_when_neither_window_lost_time_to_the_hypervisor() -> None:
    before = [100, 0, 50, 800, 10, 0, 0, 40, 0, 0]
    after = [200, 0, 100, 1000, 20, 0, 0, 60, 7, 0]  # 380 ticks, 20 of them stolen
    assert ab.steal_share(before, after) == pytest.approx(20 / 380)
    assert ab.steal_share(before, before) == 0.0
    rates = [(100.0, 110.0), (30.0, 105.0), (100.0, 108.0)]
    steals = [(0.0, 0.005), (0.06, 0.0), (0.002, 0.0)]
    assert ab.quiet(rates, steals) == [(100.0, 110.0), (100.0, 108.0)]


def test_the_machines_cpu_times_are_read() -> None:
    first = ab.cpu_times()
    assert len(first) >= 8 and sum(first) > 0


def test_a_workload_that_needs_a_preloaded_queue_is_refused() -> None:
    with pytest.raises(SystemExit):
        ab.main(["--targets", "sqsq-cluster,sqsq-cluster-4", "--workloads", "recv-1x100B"])


def test_the_cpu_cell_is_the_median_of_each_side() -> None:
    assert ab.cpu_cell([(100.0, 30.0), (300.0, 10.0), (200.0, 20.0)]) == "200 + 20"
    assert ab.cpu_cell([]) == "?"
