"""Group commit: a shard leader's commands, gathered into log entries and answered.

Commands queued in one turn of the event loop share an entry. While an entry is out, new
commands wait for its answer and share the next one; a second entry goes out beside it only
once ``PIPELINE_GROUP`` commands wait (up to ``MAX_IN_FLIGHT`` entries, ``MAX_GROUP``
commands in one). Each entry is one replication round trip and one fsync per replica, shared
by every command in it, and under a moderate load (each shard's share of a cluster's
clients) that cost per entry dominates: proposing at once whenever a slot was free wrote
twice as many entries per message in a cluster of four shards.

Callbacks on the event loop, not tasks: a command costs no task switch between its caller
and the log, nor between the commit and its answer. An entry's commands are answered once it
is committed and applied here while this replica still leads in the term it proposed in;
otherwise NotLeader (not appended: retry at the leader) or ServiceUnavailable (outcome
unknown: retry with the same request id).

A command whose caller stopped waiting (its future cancelled: a deadline, a cancel, a
connection gone) before its entry went out is not proposed: the caller learns nothing either
way. One that was already out is applied all the same, and its result is handed to
``unclaimed``: a receive's messages are in flight for nobody, and only its caller could
release them early (the engine does it for it).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from sqsq.core.entry import Entry, encode_entry
from sqsq.errors import ErrorCode, Rejection
from sqsq.shard.replica import Proposal, RaftReplica

MAX_GROUP = 512  # commands per entry: bounds one entry's size and apply time
MAX_IN_FLIGHT = 4  # entries proposed and not yet answered
PIPELINE_GROUP = 8  # waiting commands that open a second entry beside one in flight
PROPOSAL_TIMEOUT_S = 10.0  # then the outcome is unknown


class Proposer:
    """One shard leader's group commit. ``stamp_now``: the time the next entry carries;
    ``not_leader``: the answer for commands the log refused; ``wake``: called with each
    queue an applied command's effects name (long polls)."""

    def __init__(self, replica: RaftReplica, stamp_now: Callable[[], int],
                 not_leader: Callable[[], Rejection], wake: Callable[[str], None]) -> None:
        self.replica = replica
        self.stamp_now = stamp_now
        self.not_leader = not_leader
        self.wake = wake
        # (command, result) of a command applied after its caller stopped waiting
        self.unclaimed: Callable[[Any, Any], None] | None = None
        self.on_group_commit: Callable[[int], None] | None = None  # commands per entry
        self._pending: deque[tuple[Any, asyncio.Future]] = deque()  # not yet proposed
        self._flush_due = False  # a flush runs at the end of the loop's turn
        self._in_flight = 0  # entries proposed and not yet answered
        self._none_in_flight = asyncio.Event()
        self._none_in_flight.set()
        self._closing = False

    @property
    def busy(self) -> bool:
        """Whether a command is queued or an entry is out."""
        return bool(self._in_flight or self._pending)

    def submit(self, command: Any, fut: asyncio.Future) -> None:
        """Queue ``command`` for the next entry; ``fut`` gets its result."""
        self._pending.append((command, fut))
        if not self._flush_due and self._may_propose():
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def close(self) -> None:
        """Answer what is queued (ServiceUnavailable), and wait until every entry out is
        answered: committed, refused or timed out."""
        self._closing = True
        self._flush()
        await self._none_in_flight.wait()

    def _may_propose(self) -> bool:
        in_flight = self._in_flight
        return not in_flight or (in_flight < MAX_IN_FLIGHT
                                 and len(self._pending) >= PIPELINE_GROUP)

    def _flush(self) -> None:
        self._flush_due = False
        pending = self._pending
        while self._closing and pending:  # stopping: answered here, never proposed
            settle(pending.popleft()[1],
                   Rejection(ErrorCode.SERVICE_UNAVAILABLE, "The shard is stopping."))
        while pending and self._may_propose():
            batch = [pending.popleft() for _ in range(min(len(pending), MAX_GROUP))]
            batch = [item for item in batch if not item[1].cancelled()]
            if batch:
                self._propose(batch)

    def _propose(self, batch: list) -> None:
        loop = asyncio.get_running_loop()
        data, batch = _encode(self.stamp_now(), batch)
        if self.on_group_commit is not None:
            self.on_group_commit(len(batch))
        proposal = _InFlight(batch)
        proposal.timer = loop.call_later(PROPOSAL_TIMEOUT_S, self._answer, proposal,
                                         Proposal.UNKNOWN, None)
        self._in_flight += 1
        self._none_in_flight.clear()

        # Called on the event loop: when the entry is applied (answered there and then: a
        # turn of the loop less on every call's path), or at once when refused or given up
        # (answered on the next turn: ``propose`` may be calling back from ``_flush``).
        def on_done(status: Proposal, result: Any) -> None:
            if status is Proposal.COMMITTED:
                self._answer(proposal, status, result)
            else:
                loop.call_soon(self._answer, proposal, status, result)

        self.replica.propose(data, on_done)

    def _answer(self, proposal: _InFlight, status: Proposal, outcomes: Any) -> None:
        """An entry's fate (or its timeout, whichever comes first): answer its commands."""
        batch = proposal.batch
        if batch is None:
            return  # answered already: this is the other of the two
        proposal.batch = None
        proposal.timer.cancel()  # type: ignore[union-attr]
        self._in_flight -= 1
        if not self._in_flight:
            self._none_in_flight.set()
        if status is Proposal.COMMITTED and outcomes is not None:
            results = iter(outcomes)
            for command, fut in batch:
                outcome = next(results)
                if fut.cancelled() and self.unclaimed is not None:
                    self.unclaimed(command, outcome.result)
                else:
                    settle(fut, outcome.result)
                for effect in outcome.effects:
                    self.wake(effect.queue)
        else:
            failure = self.not_leader() if status is Proposal.NOT_LEADER else Rejection(
                ErrorCode.SERVICE_UNAVAILABLE,
                "The outcome is unknown: the shard's leader changed. Retry the request.")
            for _, fut in batch:
                settle(fut, failure)
        if self._pending and not self._flush_due:
            self._flush()  # what waited for the entry out goes now


class _InFlight:
    """An entry proposed and not yet answered: its commands with their futures, and the
    timer that answers them if the log never does."""

    __slots__ = ("batch", "timer")

    def __init__(self, batch: list) -> None:
        self.batch: list | None = batch
        self.timer: asyncio.TimerHandle | None = None


def _encode(now: int, batch: list) -> tuple[bytes, list]:
    """The entry for ``batch``. A command the log cannot carry (a value out of any range the
    edge checked, such as an integer past 64 bits) is refused on its own, not with the rest."""
    try:
        return encode_entry(Entry(now, tuple(cmd for cmd, _ in batch))), batch
    except ValueError:
        kept = []
        for cmd, fut in batch:
            try:
                encode_entry(Entry(now, (cmd,)))
            except ValueError as exc:
                settle(fut, Rejection(ErrorCode.INVALID_PARAMETER_VALUE, str(exc)))
                continue
            kept.append((cmd, fut))
        return encode_entry(Entry(now, tuple(cmd for cmd, _ in kept))), kept


def settle(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)
