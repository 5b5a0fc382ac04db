"""One shard's leader loop in a single process: stamp, apply, group-commit, run effects.

Commands arrive from many concurrent requests. The committer takes whatever has queued up
and applies each command to the open group's transaction (a failed command's writes are
rolled back to its savepoint). A group is written, with the applied index, as one RocksDB
batch; its callers are answered, and its effects (waking long polls) run, only once an fsync
of the write-ahead log has covered that batch. The fsync runs in a thread while the loop
applies the next commands, and one fsync covers every group written before it started: many
small requests share one fsync. While an fsync runs, the commands that arrive are applied at
once but gathered into one open group, written when that fsync returns, just before the next
one starts: no later than a group of their own would have been covered, and with one batch
write (and one applied-index update) for all of them instead of one per command. The same
loop is where a Raft adapter will propose instead of writing directly; ``apply`` does not
change.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqsq.core import commands as c
from sqsq.core import records, redrive
from sqsq.core.errors import ErrorCode, Rejection
from sqsq.core.machine import apply, effective_now, sweep_needed
from sqsq.core.state import ShardConfig, ShardState
from sqsq.core.txn import Txn
from sqsq.shard.store import Store

log = logging.getLogger("sqsq.shard")
T = TypeVar("T")

MAX_GROUP = 512  # commands per group commit: bounds latency of one fsync round
SWEEP_INTERVAL_S = 0.1


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def message_ids(n: int) -> tuple[str, ...]:
    """``n`` random (version 4) UUIDs as text, from one read of the OS's random source.

    The same strings as ``str(uuid.uuid4())`` n times, at a third of the cost: one syscall
    for all of them and no UUID objects.
    """
    raw = bytearray(os.urandom(16 * n))
    ids = []
    for i in range(0, 16 * n, 16):
        raw[i + 6] = raw[i + 6] & 0x0F | 0x40  # version 4
        raw[i + 8] = raw[i + 8] & 0x3F | 0x80  # RFC 4122 variant
        h = raw[i : i + 16].hex()
        ids.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return tuple(ids)


def stamp(command: c.Command) -> c.Command:
    """The leader's random values go into the command, so replicas need not draw them."""
    if isinstance(command, c.SendMessages):
        ids = message_ids(len(command.entries))
        return c.SendMessages(command.queue, command.entries, command.request_id, ids)
    if isinstance(command, c.ReceiveMessages):
        return dataclasses.replace(command, nonce=secrets.randbits(64))
    if isinstance(command, redrive.StartMoveTask):
        return dataclasses.replace(command, task_handle=secrets.token_urlsafe(24))
    return command


class Waiters:
    """Long polls parked per queue; an effect wakes every poll on that queue."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def event(self, queue: str) -> asyncio.Event:
        ev = self._events.get(queue)
        if ev is None:
            ev = self._events[queue] = asyncio.Event()
        return ev

    def wake(self, queue: str) -> None:
        ev = self._events.pop(queue, None)
        if ev is not None:
            ev.set()

    def __len__(self) -> int:
        """Queues with a poll parked on them."""
        return len(self._events)

    def forget(self, queue: str) -> None:
        """Drop a queue's event unset: a poll on a queue that does not exist must not leave
        one behind (a client could otherwise grow this map with made-up names)."""
        self._events.pop(queue, None)

    def wake_all(self) -> None:
        for queue in list(self._events):
            self.wake(queue)


@dataclasses.dataclass
class _OpenGroup:
    """Commands applied to one transaction that is not written yet, with their outcomes."""

    txn: Txn
    group: list = dataclasses.field(default_factory=list)
    outcomes: list[c.Outcome] = dataclasses.field(default_factory=list)


class ShardEngine:
    def __init__(
        self,
        store: Store,
        config: ShardConfig,
        *,
        sync: bool = True,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.store = store
        self.config = config
        self.sync = sync
        self.clock_ms = clock_ms
        self.waiters = Waiters()
        self._queue: asyncio.Queue[tuple[c.Command, asyncio.Future]] | None = None
        self._io = ThreadPoolExecutor(1, thread_name_prefix="sqsq-fsync")
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self._failed: Rejection | None = None
        self.long_polls_allowed = True
        # Pipelined durability: groups written (unsynced) and groups covered by an fsync.
        self._written = 0
        self._synced = 0
        self._unsynced: deque[tuple[int, list, list[c.Outcome]]] = deque()
        self._syncer: asyncio.Task | None = None
        self._reads: deque[tuple[int, asyncio.Future]] = deque()  # (group seen, durable?)
        # Applied, not yet written: gathers the commands that arrive while an fsync runs.
        self._open: _OpenGroup | None = None
        self.applied_index = records.Meta.decode(store.get(records.META_KEY)).applied_index

    # ---- lifecycle ----
    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._tasks = [
            asyncio.create_task(self._committer(), name="committer"),
            asyncio.create_task(self._ticker(), name="ticker"),
        ]

    def end_long_polls(self) -> None:
        """Shutting down: parked receives return what they have (nothing) at once."""
        self.long_polls_allowed = False
        self.waiters.wake_all()

    async def stop(self) -> None:
        """Finish what is queued, then stop: every acknowledged command is on disk."""
        self._closing = True
        if self._queue is not None:
            await self._queue.join()
        tasks = [*self._tasks, *([self._syncer] if self._syncer else [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._io.shutdown(wait=True)
        self.store.close()

    # ---- commands and queries ----
    async def execute(self, command: c.Command) -> c.Result:
        if self._closing or self._queue is None:
            return Rejection(ErrorCode.SERVICE_UNAVAILABLE, "The shard is shutting down.")
        if self._failed is not None:
            return self._failed
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((stamp(command), fut))  # unbounded: never waits
        return await fut

    def query(self, fn: Callable[..., T], *args: object) -> T:
        """A read-only question: ``fn(state, *args, now)`` over the latest written state,
        which may include groups whose fsync is still running (see ``read``). The open group
        (applied, not yet written) is not seen: none of its callers has been answered."""
        txn = Txn(self.store)
        now = effective_now(txn, self.clock_ms())
        return fn(ShardState(txn, self.config), *args, now)

    async def read(self, fn: Callable[..., T], *args: object) -> T | Rejection:
        """``query`` for a client: answered only once every group it could have seen is on
        disk, so nobody learns of a queue or message that a crash could still take back."""
        if self._failed is not None:  # a failed fsync is never retried: nothing is durable now
            return self._failed
        result = self.query(fn, *args)
        seen = self._written
        if self._synced < seen and self.sync:
            durable: asyncio.Future = asyncio.get_running_loop().create_future()
            self._reads.append((seen, durable))
            if not await durable:
                return self._failed or Rejection(ErrorCode.SERVICE_UNAVAILABLE, "fsync failed")
        return result

    # ---- the loop ----
    async def _committer(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            room = MAX_GROUP - (len(self._open.group) if self._open is not None else 0)
            while len(batch) < room and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            if self._failed is not None:
                self._answer(batch, None, self._failed)
                continue
            if self._open is None:
                self._open = _OpenGroup(Txn(self.store))
            applied_before = len(self._open.group)
            try:
                self._apply(self._open, batch)
            except Exception as exc:  # not a command's failure: stop rather than guess
                applied = len(self._open.group) - applied_before
                self._fail_open("commit failed", exc)
                self._answer(batch[applied:], None, self._failed)
                continue
            if self.sync and self._syncing() and len(self._open.group) < MAX_GROUP:
                continue  # the running fsync loop writes the open group when its fsync returns
            if self._write_open() and self.sync and not self._syncing():
                self._syncer = asyncio.create_task(self._sync_loop())

    def _syncing(self) -> bool:
        return self._syncer is not None and not self._syncer.done()

    def _apply(self, open_group: _OpenGroup, batch: list) -> None:
        txn = open_group.txn
        now = self.clock_ms()
        for command, fut in batch:
            sp = txn.savepoint()
            try:
                outcome = apply(txn, self.config, command, now)
            except Exception as exc:  # a broken invariant: drop this command's writes only
                log.exception("apply failed for %r", type(command).__name__)
                txn.rollback(sp)
                outcome = c.Outcome(Rejection(ErrorCode.INTERNAL_ERROR, f"internal error: {exc}"))
            open_group.group.append((command, fut))
            open_group.outcomes.append(outcome)

    def _write_open(self) -> bool:
        """Write the open group, unsynced: the next commands read it at once; nobody hears of
        it before an fsync has covered it. False if the store failed."""
        open_group, self._open = self._open, None
        if open_group is None:
            return True
        txn, group = open_group.txn, open_group.group
        try:
            meta = records.Meta.decode(txn.get(records.META_KEY))
            meta.applied_index = self.applied_index + len(group)
            txn.put(records.META_KEY, meta.encode())
            self.store.write(txn.writes(), sync=False)
        except Exception as exc:  # the store failed: stop rather than guess
            self._open = open_group
            self._fail_open("commit failed", exc)
            return False
        self.applied_index += len(group)
        self._written += 1
        self._unsynced.append((self._written, group, open_group.outcomes))
        if not self.sync:
            self._release(self._written)
        return True

    def _fail_open(self, what: str, exc: Exception) -> None:
        """Nothing of the open group was written: its callers hear of the failure."""
        log.exception(what)
        self._failed = Rejection(ErrorCode.SERVICE_UNAVAILABLE, f"store failed: {exc}")
        open_group, self._open = self._open, None
        if open_group is not None:
            self._answer(open_group.group, None, self._failed)

    async def _sync_loop(self) -> None:
        """fsync in a thread while the loop applies the next commands; one fsync covers all
        the groups written before it started (group commit across groups)."""
        loop = asyncio.get_running_loop()
        while True:
            if self._open is not None:
                self._write_open()  # if the store fails, it answers the open group's callers
            if self._synced >= self._written:
                return
            target = self._written
            try:
                await loop.run_in_executor(self._io, self.store.sync)
            except Exception as exc:  # durability unknown: fail everything pending, stop
                log.exception("fsync failed")
                self._failed = Rejection(ErrorCode.SERVICE_UNAVAILABLE, f"fsync failed: {exc}")
                while self._unsynced:
                    _, group, _ = self._unsynced.popleft()
                    self._answer(group, None, self._failed)
                open_group, self._open = self._open, None
                if open_group is not None:
                    self._answer(open_group.group, None, self._failed)
                self._release_reads(self._written, durable=False)
                return
            self._synced = target
            self._release(target)
            self._release_reads(target, durable=True)

    def _release_reads(self, upto: int, durable: bool) -> None:
        while self._reads and self._reads[0][0] <= upto:
            _, fut = self._reads.popleft()
            if not fut.done():
                fut.set_result(durable)

    def _release(self, upto: int) -> None:
        """Groups up to ``upto`` are durable: answer them and run their effects."""
        while self._unsynced and self._unsynced[0][0] <= upto:
            _, group, outcomes = self._unsynced.popleft()
            self._answer(group, outcomes, None)

    def _answer(self, group: list, outcomes: list[c.Outcome] | None,
                failure: Rejection | None) -> None:
        assert self._queue is not None
        for i, (_, fut) in enumerate(group):
            outcome = outcomes[i] if outcomes is not None else c.Outcome(failure)
            if not fut.done():
                fut.set_result(outcome.result)
            for effect in outcome.effects:
                self.waiters.wake(effect.queue)
            self._queue.task_done()

    async def _ticker(self) -> None:
        """Propose a Sweep when time-driven work is due: timers, retention, windows, garbage."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                more = not self._closing and self.query(sweep_needed)
                while more:
                    result = await self.execute(c.Sweep())
                    more = isinstance(result, c.Swept) and result.more and not self._closing
            except Exception:
                log.exception("sweep failed")
