"""The sweep schedule: timers come due on time in a shard with many queues, and the sweep
(and the leader's check whether to sweep) reads the queues that have something due, not
every queue."""

from __future__ import annotations

from coresupport import CONFIG, Core
from sqsq.core import commands as c
from sqsq.core import keys
from sqsq.core import records as r
from sqsq.core.machine import next_sweep_ms, sweep_needed
from sqsq.core.state import ShardState
from sqsq.core.txn import Txn
from sqsq.shard.store import MemoryStore

IDLE_QUEUES = 300


class CountingStore(MemoryStore):
    """A store that counts what is read from it: keys looked up and keys scanned."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, key: bytes) -> bytes | None:
        self.reads += 1
        return super().get(key)

    def scan(self, start: bytes, end: bytes, *, reverse: bool = False):
        for item in super().scan(start, end, reverse=reverse):
            self.reads += 1
            yield item


def _core_with_idle_queues(n: int = IDLE_QUEUES) -> tuple[Core, CountingStore]:
    core = Core()
    store = CountingStore()
    core.store = store
    for i in range(n):
        core.create(f"idle-{i}")
    core.run(c.Sweep())
    return core, store


def _needed(core: Core) -> bool:
    return sweep_needed(ShardState(Txn(core.store), CONFIG), core.now_ms)


def test_deciding_to_sweep_reads_no_idle_queue() -> None:
    core, store = _core_with_idle_queues()
    store.reads = 0
    assert not _needed(core)
    assert store.reads < 10, f"{store.reads} reads to find nothing due in {IDLE_QUEUES} queues"


def test_a_sweep_visits_only_the_queue_whose_timer_is_due() -> None:
    core, store = _core_with_idle_queues()
    core.create("busy", VisibilityTimeout=5)
    core.send("busy", "a")
    [m] = core.receive("busy")
    core.advance(4)
    assert not _needed(core)
    core.advance(2)
    assert _needed(core)
    store.reads = 0
    out = core.run(c.Sweep())
    assert isinstance(out, c.Swept) and not out.more
    assert c.WakeReceivers("busy") in core.effects  # the long polls on it are woken
    assert store.reads < 60, f"{store.reads} reads for one due queue among {IDLE_QUEUES}"
    assert core.depth("busy") == (1, 0, 0)
    assert not _needed(core)
    [again] = core.receive("busy")
    assert again.message_id == m.message_id


def test_delays_and_retention_are_kept_by_the_sweep() -> None:
    core, _ = _core_with_idle_queues(20)
    core.create("late", DelaySeconds=10)
    core.create("short", MessageRetentionPeriod=60)
    core.create("order.fifo", FifoQueue="true", DelaySeconds=3,
                ContentBasedDeduplication="true")
    core.send("late", "later")
    core.send("short", "gone soon")
    core.send("order.fifo", "first", message_group_id="g")
    core.advance(3)
    core.run(c.Sweep())
    assert core.depth("order.fifo") == (1, 0, 0)
    assert core.depth("late") == (0, 0, 1)
    core.advance(7)
    core.run(c.Sweep())
    assert core.depth("late") == (1, 0, 0)
    core.advance(50)
    assert _needed(core)
    core.run(c.Sweep())
    assert core.depth("short") == (0, 0, 0)
    assert core.depth("late") == (1, 0, 0)


def test_a_shorter_retention_moves_the_queue_up_the_schedule() -> None:
    core, _ = _core_with_idle_queues(5)
    core.create("q")
    core.send("q", "x")
    core.advance(120)
    core.run(c.Sweep())
    assert core.depth("q") == (1, 0, 0)  # the default retention is four days
    core.run(c.SetQueueAttributes("q", (("MessageRetentionPeriod", "60"),)))
    assert _needed(core)
    core.run(c.Sweep())
    assert core.depth("q") == (0, 0, 0)


def test_deleted_and_purged_queues_leave_the_schedule() -> None:
    core, _ = _core_with_idle_queues(5)
    for name in ("gone", "purged"):
        core.create(name, VisibilityTimeout=5)
        core.send(name, "x")
        core.receive(name)
    core.run(c.DeleteQueue("gone"))
    core.run(c.PurgeQueue("purged"))
    core.advance(61)  # past the visibility timeouts and the deleted queue's 60 s
    while _needed(core):
        core.run(c.Sweep())
    assert not list(core.state().scan_prefix(b"S"))
    core.send("purged", "y")
    assert [m.body for m in core.receive("purged")] == ["y"]


def test_state_written_before_the_schedule_is_scheduled_by_the_first_sweep() -> None:
    core, store = _core_with_idle_queues(5)
    core.create("old", VisibilityTimeout=5)
    core.send("old", "x")
    core.receive("old")
    # Take the schedule away, as state written by a version without it would be.
    writes: dict[bytes, bytes | None] = {}
    for key, raw in store.scan(b"", b"\xff"):
        if key.startswith(b"S"):
            writes[key] = None
        elif key.startswith(b"c"):
            counters = r.Counters.decode(raw)
            counters.sweep_at = keys.NO_FLOOR
            writes[key] = counters.encode()
    meta = r.Meta.decode(store.get(keys.META_KEY))
    meta.sweep_scheduled = 0
    writes[keys.META_KEY] = meta.encode()
    store.write(writes, sync=False)
    core.advance(6)
    assert _needed(core)
    sweeps = 0
    while _needed(core):
        assert isinstance(core.run(c.Sweep()), c.Swept)
        sweeps += 1
        assert sweeps <= 3, "the sweep never settles"
    assert c.WakeReceivers("old") in core.effects
    assert core.depth("old") == (1, 0, 0)
    # Only "old" stays in the schedule: at its message's end of retention, four days on.
    [(key, name)] = core.state().scan_prefix(b"S")
    assert name == b"old" and keys.read_u64(key, 1) > core.now_ms + 3 * 86_400_000


def _needed_at(core: Core, now: int) -> bool:
    return sweep_needed(ShardState(Txn(core.store), CONFIG), now)


def _check_next_sweep(core: Core) -> int | None:
    """``next_sweep_ms`` is exactly when ``sweep_needed`` turns true as time passes."""
    due = next_sweep_ms(ShardState(Txn(core.store), CONFIG))
    if due is None:
        assert not _needed_at(core, core.now_ms + 30 * 86_400_000)
    elif due == 0:
        assert _needed_at(core, core.now_ms)
    else:
        assert not _needed_at(core, due - 1) and _needed_at(core, due)
    return due


def test_the_next_sweep_time_is_when_the_check_turns_true() -> None:
    """The leader reads ``next_sweep_ms`` once after the state changes and compares the time
    after that: it must name the first moment any timer, window or garbage is due."""
    core = Core()
    assert _check_next_sweep(core) is None  # nothing at all: never
    core.create("q", VisibilityTimeout=30)
    core.send("q", "x")
    core.run(c.Sweep())
    retention = _check_next_sweep(core)
    assert retention is not None and retention > core.now_ms + 86_400_000
    core.receive("q")
    assert _check_next_sweep(core) == core.now_ms + 30_000  # the visibility timeout
    core.create("late", DelaySeconds=5)
    core.send("late", "y")
    assert _check_next_sweep(core) == core.now_ms + 5_000  # the delay comes first
    core.create("f.fifo", FifoQueue="true", ContentBasedDeduplication="true")
    core.send("f.fifo", "z", message_group_id="g")
    core.run(c.DeleteQueue("f.fifo"))  # its garbage and its dedup window stay behind
    assert _check_next_sweep(core) == 0
    while _needed(core):
        core.run(c.Sweep())
    visits = 0
    # the delay, the timeout, the deleted queue's 60 s, the window, the retentions
    while (due := _check_next_sweep(core)) is not None:
        assert due > core.now_ms and visits < 20
        core.advance((due - core.now_ms) / 1000)
        assert _needed(core)
        while _needed(core):
            core.run(c.Sweep())
        visits += 1
    assert visits >= 5
    assert core.depth("q") == (0, 0, 0) and core.depth("late") == (0, 0, 0)  # retention
