"""The leader's clock, with clocks the test drives: the log's time never runs backwards, and
a wall clock stepped back an hour, stepped forward an hour or drifting fast changes the
log's rate by 1% at most (the rule in ``sqsq.shard.clock``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from raftsupport import free_port
from sqsq.api import Endpoint
from sqsq.core import commands as c
from sqsq.core.state import ShardConfig
from sqsq.shard.clock import LeaderClock, OffsetFileClock, wall_clock_ms
from sqsq.shard.host import Peer, ReplicaOptions, open_replica
from sqsq.shard.service import ShardService

HOUR_MS = 3_600_000


class Clocks:
    """A wall clock and a monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.wall = 1_700_000_000_000
        self.mono = 5_000

    def advance(self, ms: int) -> None:
        self.wall += ms
        self.mono += ms


def test_a_wall_clock_stepped_back_an_hour_only_slows_the_log_by_one_percent() -> None:
    t = Clocks()
    clock = LeaderClock(lambda: t.wall, lambda: t.mono)
    first = clock.stamp(0)
    assert first == t.wall  # an empty log: nothing to go by but the wall clock
    t.wall -= HOUR_MS  # stepped back an hour
    t.advance(2_000)
    assert clock.peek(first) == first + 1_980  # not frozen for an hour, not backwards
    stamped = clock.stamp(first)
    assert stamped == first + 1_980
    for _ in range(100):  # and so on, for as long as the clock stays behind
        t.advance(1_000)
        assert clock.stamp(stamped) == stamped + 990
        stamped += 990


def test_a_wall_clock_stepped_forward_an_hour_only_speeds_the_log_by_one_percent() -> None:
    t = Clocks()
    clock = LeaderClock(lambda: t.wall, lambda: t.mono)
    stamped = clock.stamp(0)
    real = t.wall
    t.wall += HOUR_MS  # stepped forward an hour: not an hour of timers at once
    t.advance(1_000)
    real += 1_000
    assert clock.stamp(stamped) == stamped + 1_010
    stamped += 1_010
    for _ in range(100):
        t.advance(1_000)
        real += 1_000
        assert clock.stamp(stamped) == stamped + 1_010
        stamped += 1_010
    assert stamped - real == 1_010  # 101 s later: 1.01 s ahead of real time, not an hour


def test_a_wall_clock_drifting_fast_is_followed_up_to_one_percent() -> None:
    t = Clocks()
    clock = LeaderClock(lambda: t.wall, lambda: t.mono)
    stamped = clock.stamp(0)
    for _ in range(50):  # 0.5% fast: within the bound, followed exactly
        t.mono += 1_000
        t.wall += 1_005
        assert clock.stamp(stamped) == t.wall
        stamped = t.wall
    for _ in range(50):  # 5% fast: followed at 1% only
        t.mono += 1_000
        t.wall += 1_050
        assert clock.stamp(stamped) == stamped + 1_010
        stamped += 1_010


def test_a_new_leader_an_hour_ahead_starts_from_the_log_it_applied() -> None:
    """A follower whose wall clock is an hour fast observes the log's time as it applies
    entries; when it becomes leader, it goes on from there at the real rate, plus 1%."""
    t = Clocks()
    follower = LeaderClock(lambda: t.wall + HOUR_MS, lambda: t.mono)
    log_now = t.wall
    for _ in range(10):  # the old leader stamps real time; this replica applies it
        t.advance(100)
        log_now = t.wall
        follower.observe(log_now)
    t.advance(2_000)  # the old leader dies; an election later this one leads
    first = follower.stamp(log_now)
    assert first == log_now + 2_020
    t.advance(60_000)
    assert follower.stamp(log_now) == first + 60_600  # a 60 s retention: >= 59.4 s real


def test_the_log_time_is_a_floor_and_peek_records_nothing() -> None:
    t = Clocks()
    clock = LeaderClock(lambda: t.wall, lambda: t.mono)
    assert clock.peek(t.wall + 500) == t.wall + 500  # a previous leader's clock ran ahead
    t.advance(100)
    assert clock.peek(0) == t.wall  # the peek above set no floor
    stamped = clock.stamp(0)
    t.wall -= HOUR_MS
    assert clock.peek(0) == stamped


def test_an_offset_file_steps_the_clock(tmp_path: Path) -> None:
    path = tmp_path / "offset"
    clock = OffsetFileClock(path)
    assert abs(clock() - wall_clock_ms()) < 1_000  # no file: the system clock
    path.write_text(str(-HOUR_MS))
    clock._checked_mono -= OffsetFileClock.RECHECK_MS  # the next call re-reads the file
    assert abs(clock() - (wall_clock_ms() - HOUR_MS)) < 1_000


def test_a_leader_whose_clock_steps_back_still_redelivers_and_stamps_in_order(
        tmp_path: Path) -> None:
    t = Clocks()

    async def scenario() -> None:
        me = Peer("127.0.0.1", 0, free_port())
        engine = open_replica(0, tmp_path, ShardConfig(0, b"k"), me, [me],
                              ReplicaOptions(bootstrap=True, memory=True))
        engine.clock = LeaderClock(lambda: t.wall, lambda: t.mono)
        await engine.start()
        assert await engine.wait_leading(10.0)
        api = ShardService(engine, Endpoint())
        await api.create_queue("q")
        await api.send_message_batch("q", [c.SendEntry("0", "before")])
        [got] = await api.receive_message("q", visibility_timeout=2, wait_time_seconds=0,
                                          attribute_names=["All"])
        t.wall -= HOUR_MS  # the leader's wall clock is stepped back an hour
        await api.send_message_batch("q", [c.SendEntry("0", "after")])
        t.advance(1_000)
        first = await api.receive_message("q", max_number_of_messages=10, wait_time_seconds=0,
                                          attribute_names=["All"])
        assert [m.body for m in first] == ["after"]  # "before" is still in flight
        t.advance(1_500)  # its 2 s visibility timeout ran out, by the real time elapsed
        again = await api.receive_message("q", max_number_of_messages=10, wait_time_seconds=0)
        assert [m.message_id for m in again] == [got.message_id]
        sent = [int(dict(m.attributes)["SentTimestamp"]) for m in (got, *first)]
        assert sent == sorted(sent)  # the later send is not stamped an hour earlier
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))
