"""What a shard's leader does with requests: stamp, group into log entries, propose, answer.

Commands arrive from many concurrent requests; the leader stamps each (message ids, receipt
nonces, task handles) and each entry (the time, never below the last applied), so every
replica that applies the entry reaches the same state, and groups them into log entries
(``shard.proposer``: group commit, one replication round trip and one fsync per replica
shared by every request in an entry). Callers are answered, and effects (waking long polls)
run, only once the entry is committed and applied here while this replica still leads in
the term it proposed in.

Reads that a client sees take no log entry: the leader confirms with a quorum that it still
leads and waits until it has applied everything committed when the read arrived (ReadIndex,
``shard.reads``), then answers from its state, so a read sees every write acknowledged
before it, and a deposed leader cut off from its followers answers NotLeader, never from a
stale view. A receive that finds nothing to deliver is such a read too.

Time-driven work (timers, retention, windows) is a Sweep the leader proposes when its state
says one is due; one scheduler per process asks every engine (``shard.sweeps``).

Single-node mode is the same code over a one-member group.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqsq.core import commands as c
from sqsq.core import keys, records
from sqsq.core.machine import HANDLERS, effective_now, next_sweep_ms, sweep_needed
from sqsq.core.state import ShardConfig, ShardState
from sqsq.core.txn import KVReader, Txn
from sqsq.errors import ErrorCode, QueueError, Rejection, from_rejection, not_leader_message
from sqsq.prompt import PromptFuture
from sqsq.shard.clock import LeaderClock, Ms, monotonic_ms, wall_clock_ms
from sqsq.shard.currentstore import Installing
from sqsq.shard.handover import HandOver
from sqsq.shard.longpoll import Waiters
from sqsq.shard.proposer import Proposer, settle
from sqsq.shard.replica import RaftReplica
from sqsq.shard.stamp import stamp
from sqsq.shard.statemachine import ShardMachine
from sqsq.shard.sweeps import SweepScheduler

log = logging.getLogger("sqsq.shard")
T = TypeVar("T")

LEADER_WAIT_S = 3.0  # a request that finds no leader waits this long for an election
# ... but in a group of several, no longer than this: a node that knows no leader may be the
# one cut off (a deposed leader sees no election), and its callers do better trying another
# node (they rotate on a NotLeader without a hint) than waiting here for seconds.
GROUP_LEADER_WAIT_S = 0.5
# A read whose leadership is not confirmed by then is answered "retry" (a leader cut off
# from its quorum stands down within an election timeout and answers NotLeader sooner).
READ_TIMEOUT_S = 5.0


class ShardEngine(HandOver):
    """The leader side of one shard replica (every replica runs one; only a leader serves)."""

    def __init__(
        self,
        machine: ShardMachine,
        replica: RaftReplica,
        *,
        clock_ms: Ms = wall_clock_ms,
        mono_ms: Ms = monotonic_ms,
        leader_hint: Callable[[str | None], str | None] = lambda raft_address: None,
        sweeps: SweepScheduler | None = None,
    ) -> None:
        """``sweeps``: the process's sweep scheduler, shared by its engines (default: one of
        this engine's own)."""
        self.machine = machine
        self.replica = replica
        self.config: ShardConfig = machine.config
        self.clock = LeaderClock(clock_ms, mono_ms)
        self.leader_hint = leader_hint  # raft address -> the address clients should use
        self.waiters = Waiters()
        self.long_polls_allowed = True
        self._loop: asyncio.AbstractEventLoop | None = None  # set by start
        self.proposer = Proposer(replica, lambda: self.clock.stamp(self.machine.last_now_ms),
                                 self.not_leader, self.waiters.wake)
        self.proposer.unclaimed = self._release_unclaimed
        self._handing_over: asyncio.Future | None = None  # see hand_over
        self._closing = False
        self.sweeps = sweeps or SweepScheduler()
        # What the sweep check last read (term, applied index), and what it found: the time
        # the next sweep is due (None: never; 0: now) and whether the configuration is
        # recorded. Read again only when either moved, so an idle shard costs no reads.
        self._sweep_checked: tuple[int, int] | None = None
        self._sweep_due: int | None = None
        self._configured = False
        self._sweeping: asyncio.Task | None = None
        self._observed_ms = 0  # the log time a follower last passed to ``clock.observe``

    @property
    def store(self) -> Any:
        return self.machine.store

    @property
    def applied_index(self) -> int:
        return self.machine.applied_index

    def leading_term(self) -> int | None:
        """The Raft term this replica leads in, or None while it does not lead."""
        return self.replica.raftCurrentTerm if self.replica.is_leader() else None

    def members(self) -> frozenset[str]:
        """The Raft addresses of the group's members, as this replica's log has them."""
        return self.replica.members()

    def learners(self) -> frozenset[str]:
        """Those of ``members`` that do not vote yet."""
        return self.replica.learners()

    async def change_member(self, add: str | None = None, remove: str | None = None,
                            timeout_s: float = 10.0) -> bool:
        """Add or remove one member of the group (leader only); True once committed."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        self.replica.change_member(
            add, remove, lambda ok: loop.call_soon(settle, done, ok))
        try:
            return await asyncio.wait_for(done, timeout_s)
        except TimeoutError:
            return False

    # ---- lifecycle ----
    async def start(self) -> None:
        await self.replica.start()
        if len(self.replica.members()) > 1:  # others keep the time: start from the log's
            self.clock.observe(self.machine.last_now_ms)
        self._loop = asyncio.get_running_loop()
        self.sweeps.add(self)

    async def wait_leading(self, timeout_s: float) -> bool:
        """Whether this replica leads, with everything committed before it applied, within
        ``timeout_s`` (a one-member group elects itself within an election timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.replica.is_leader() and await self.barrier() is None:
                return True
            await asyncio.sleep(0.02)
        return False

    def end_long_polls(self) -> None:
        """Shutting down: parked receives return what they have (nothing) at once."""
        self.long_polls_allowed = False
        self.waiters.wake_all()

    async def stop(self) -> None:
        """Answer what is queued, then stop the replica and close the store."""
        self._closing = True
        await self.proposer.close()
        await self.sweeps.remove(self)
        if self._sweeping is not None:
            self._sweeping.cancel()
            await asyncio.gather(self._sweeping, return_exceptions=True)
        await self.replica.stop()
        self.machine.close()

    # ---- commands and queries ----
    def not_leader(self) -> Rejection:
        hint = self.leader_hint(self.replica.leader_address())
        return Rejection(ErrorCode.NOT_LEADER, not_leader_message(hint))

    def _admitted(self) -> bool:
        """Whether ``_admit`` admits a request at once (it leads, and neither hands over nor
        stops): the usual case, checked without a coroutine to run."""
        return self._handing_over is None and not self._closing and self._loop is not None \
            and self.replica.fatal is None and self.replica.is_leader()

    async def _admit(self) -> Rejection | None:
        if self._handing_over is not None:
            await asyncio.shield(self._handing_over)  # then it leads no more, or still does
        if self._closing or self._loop is None:
            return Rejection(ErrorCode.SERVICE_UNAVAILABLE, "The shard is shutting down.")
        if self.replica.fatal is not None:
            return Rejection(ErrorCode.SERVICE_UNAVAILABLE, "The shard replica has stopped.")
        if self.replica.is_leader():
            return None
        alone = len(self.replica.members()) <= 1
        deadline = time.monotonic() + (LEADER_WAIT_S if alone else GROUP_LEADER_WAIT_S)
        while self.replica.leader_address() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # an election is under way: wait for its outcome
        return None if self.replica.is_leader() else self.not_leader()

    async def execute(self, command: c.Command) -> c.Result:
        if not self._admitted():
            rejection = await self._admit()
            if rejection is not None:
                return rejection
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self.proposer.submit(stamp(command), fut)
        return await fut

    def _release_unclaimed(self, command: Any, result: Any) -> None:
        """A receive applied after its caller stopped waiting (a long poll that another
        partition's answered first, a deadline, a connection gone): its messages would stay
        in flight for nobody until their visibility timeout ends (the chaos suite's clock
        probe saw a cohort lose that race four times running and expire undelivered). They
        are made visible again at once; their receive count stays, as for a receive whose
        answer was lost on the way."""
        if not isinstance(result, c.Received) or not result.messages:
            return
        handles = tuple((str(i), m.receipt_handle, 0) for i, m in enumerate(result.messages))
        release: asyncio.Future = self._loop.create_future()  # type: ignore[union-attr]
        self.proposer.submit(stamp(c.ChangeVisibilities(command.queue, handles)), release)

    def submit(self, command: c.Command) -> Awaitable[c.Result]:
        """``execute``, for the calls of a client: when the command is admitted at once (the
        usual case) the future its entry answers, with no coroutine of its own in between
        (each level of coroutine is one more to create, and to pass through on every
        resume, on every call)."""
        if not self._admitted():
            return self.execute(command)
        # (a stream call's driver takes its next step as this is answered: ``sqsq.prompt``)
        fut = PromptFuture(loop=self._loop)
        self.proposer.submit(stamp(command), fut)
        return fut

    async def barrier(self) -> None | Rejection:
        """Wait until this replica has confirmed that it still leads and has applied
        everything committed before this call (ReadIndex: no log entry). A Rejection if it
        does not lead (NotLeader) or cannot confirm it in time (ServiceUnavailable)."""
        if not self._admitted():
            rejection = await self._admit()
            if rejection is not None:
                return rejection
        loop = asyncio.get_running_loop()
        confirmed: asyncio.Future = loop.create_future()
        self.replica.read_index(lambda ok: loop.call_soon(settle, confirmed, ok))
        try:
            ok = await asyncio.wait_for(confirmed, READ_TIMEOUT_S)
        except TimeoutError:
            return Rejection(ErrorCode.SERVICE_UNAVAILABLE,
                             "The shard's leader could not confirm it still leads. Retry the "
                             "request.")
        return None if ok else self.not_leader()

    def now_ms(self) -> int:
        """The time as this replica's leader would stamp it now (see ``shard.clock``)."""
        return self.clock.peek(self.machine.last_now_ms)

    def query(self, fn: Callable[..., T], *args: object) -> T:
        """A read-only question ``fn(state, *args, now)`` over this replica's applied state,
        as is: for the leader's own bookkeeping (sweep checks, a queue's wait time)."""
        try:
            with self.machine.store.reading():  # never over a store an install closed
                txn = Txn(self.store)
                now = effective_now(txn, self.now_ms())
                return fn(ShardState(txn, self.config), *args, now)
        except Installing:
            raise from_rejection(Rejection(
                ErrorCode.SERVICE_UNAVAILABLE,
                "The replica is installing a snapshot. Retry the request.")) from None

    async def read(self, fn: Callable[..., T], *args: object) -> T | Rejection:
        """``query`` for a client: after a barrier, so it sees every write acknowledged before
        it and only what is committed."""
        rejection = await self.barrier()
        if rejection is not None:
            return rejection
        return self.query(fn, *args)

    async def receive(self, command: c.ReceiveMessages) -> c.Result:
        """A receive: proposed only if it may change something (deliver a message, move
        one, answer a retried attempt). One that finds nothing is answered as a read: after
        a barrier, a look at the applied state that would change nothing is the answer,
        with no log entry."""
        if not self._admitted():
            rejection = await self._admit()
            if rejection is not None:
                return rejection
        if not self._counted_visible(command.queue):  # maybe nothing: confirm it is current
            rejection = await self.barrier()
            if rejection is not None:
                return rejection
            # A look for one message changes something exactly when one for more would
            # (both scan until they claim one) and answers the same when it does not
            # (nothing, or a refusal); it stops at the first message it finds.
            answer = self._look(dataclasses.replace(command, max_number_of_messages=1))
            if answer is not None:
                return answer
        taken = self.submit(command)
        try:
            return await taken
        except asyncio.CancelledError:
            # answered just as its caller left (the proposer still saw it waiting)
            if isinstance(taken, asyncio.Future) and taken.done() and not taken.cancelled():
                self._release_unclaimed(command, taken.result())
            raise

    def _counted_visible(self, queue: str) -> bool:
        """Whether a standard queue counts visible messages here: then a receive very
        likely delivers one, and goes to the log without a look first (a FIFO queue's
        visible messages may all be held by their groups). A look at two records that
        needs no time (``query`` would work out ``now`` too: a read and a decode more, for
        every receive)."""
        store = self.machine.store
        try:
            with store.reading():
                return _counted_visible(store, queue)
        except Exception:  # noqa: BLE001 - installing, say
            return False

    def _look(self, command: c.Command) -> c.Result | None:
        """What ``command`` would answer over the applied state, if its apply would change
        nothing (no write, no effect); None if it would, or the state cannot be read."""
        try:
            return self.query(_unchanged, command)
        except Exception:  # noqa: BLE001 - installing, say: the log decides
            return None

    def check_sweep(self) -> None:
        """Called by the process's sweep scheduler every ``SWEEP_INTERVAL_S``: the leader
        proposes a Sweep when time-driven work is due (timers, retention, windows, garbage),
        and records the configuration first; followers never do, and keep up with the log's
        time instead. Reads the state only when it changed since the last look."""
        replica = self.replica
        if self._closing or self._sweeping is not None:
            return
        if not replica.is_leader():
            self._sweep_checked = None  # look again once it leads
            last_ms = self.machine.last_now_ms
            if last_ms != self._observed_ms and len(replica.members()) > 1:
                # a follower keeps up with the log's time (``shard.clock``) as it applies it;
                # a group of one keeps none but its own, and starts from its wall clock
                self.clock.observe(last_ms)
                self._observed_ms = last_ms
            return
        mark = (replica.raftCurrentTerm, self.machine.applied_index)
        if mark != self._sweep_checked:
            try:
                self._configured = self.machine.recorded_fingerprint() is not None
                self._sweep_due = self.query(lambda st, now: next_sweep_ms(st))
            except QueueError:  # installing a snapshot: look again at the next tick
                return
            self._sweep_checked = mark
        if not self._configured or (
                self._sweep_due is not None and self.now_ms() >= self._sweep_due):
            self._sweeping = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        try:
            if self.machine.recorded_fingerprint() is None:
                await self.execute(c.Configure(self.config.fingerprint()))
            more = self.query(sweep_needed)
            while more:
                result = await self.execute(c.Sweep())
                more = isinstance(result, c.Swept) and result.more and not self._closing
        except Exception:
            log.exception("sweep failed")
        finally:
            self._sweeping = None
            self._sweep_checked = None  # whatever happened, look again


def _counted_visible(store: KVReader, queue: str) -> bool:
    """Two records read as they are stored (no transaction or state to build around them:
    this is asked for every receive, on the event loop)."""
    raw = store.get(keys.queue_key(queue))
    if not raw:
        return False
    q = records.QueueRecord.decode(raw)
    if q.attributes.fifo_queue:
        return False
    counters = store.get(keys.counters_key(q.qid))
    return counters is not None and records.Counters.decode(counters).visible > 0


def _unchanged(st: ShardState, command: c.Command, now: int) -> c.Result | None:
    """A query: ``command``'s result if its apply at ``now`` writes nothing and has no
    effect (a scratch transaction: nothing is kept either way), else None."""
    outcome = HANDLERS[type(command)](st, command, now)
    return outcome.result if not len(st.txn) and not outcome.effects else None  # type: ignore[arg-type]

