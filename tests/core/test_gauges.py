"""The per-queue figures metrics export: depths by state and the oldest message's enqueue time,
read from the shard's counters and one index seek per queue."""

from __future__ import annotations

from coresupport import Core
from sqsq.core import queries
from sqsq.core.machine import effective_now
from sqsq.core.records import Counters


def gauges(k: Core) -> dict[str, tuple[Counters, int | None]]:
    st = k.state()
    now = effective_now(st.txn, k.now_ms)
    return {g.name: (g.counts, g.oldest_enqueued_ms) for g in queries.queue_gauges(st, now)}


def test_depths_and_oldest_follow_sends_receives_and_deletes() -> None:
    k = Core()
    k.create("empty")
    k.create("work")
    start = k.now_ms
    k.send("work", "first")
    k.advance(5)
    k.send("work", "second")
    k.send("work", "later", delay_seconds=60)
    (m,) = k.receive("work", timeout=30)  # the first one: in flight
    assert gauges(k) == {
        "empty": (Counters(0, 0, 0), None),
        "work": (Counters(visible=1, in_flight=1, delayed=1), start),
    }
    k.delete("work", m.receipt_handle)
    counts, oldest = gauges(k)["work"]
    assert (counts.visible, counts.in_flight, counts.delayed) == (1, 0, 1)
    assert oldest == start + 5_000  # the oldest left is the second


def test_timers_due_but_not_swept_are_counted_where_they_are_going() -> None:
    k = Core()
    k.create("q")
    k.send("q", "x", delay_seconds=10)
    k.advance(11)  # the delay is over; no sweep has run
    counts, _ = gauges(k)["q"]
    assert (counts.visible, counts.in_flight, counts.delayed) == (1, 0, 0)
    assert k.depth("q") == (1, 0, 0)  # the same figures GetQueueAttributes gives
