"""A Ready that needs no wait is acted on in the turn of what made it: a lone proposal is
written (and, in a group of one, committed and answered) before ``propose`` returns, and a
follower writes and answers the appends of one read from its leader once, as soon as they
are stepped in. One that needs the disk for long still goes to the Ready loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from sqsq.core import commands as c
from sqsq.core.entry import Entry, encode_entry
from sqsq.core.state import ShardConfig
from sqsq.raft import Entry as RaftEntry
from sqsq.raft import Message, MsgType
from sqsq.shard import readyloop
from sqsq.shard.replica import Proposal, RaftReplica, Replicas
from sqsq.shard.statemachine import ShardMachine

SHARD = 1
CONFIG = ShardConfig(shard_id=SHARD, secret=b"s" * 32)
ME = "127.0.0.1:7001"
LEADER = "127.0.0.1:7101"
TIMEOUT_S = 20.0


async def until(done: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not done():
            await asyncio.sleep(0.01)


def create_queue(name: str) -> bytes:
    return encode_entry(Entry(1_000, (c.CreateQueue(name),)))


@pytest.fixture(autouse=True)
def fast_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    # A slow first fsync on a busy machine would send the writes to the writer thread.
    monkeypatch.setattr(readyloop, "INLINE_WRITE_S", 3600.0)


def test_a_lone_proposal_of_a_group_of_one_is_answered_before_propose_returns(
        tmp_path: Path) -> None:
    asyncio.run(group_of_one(tmp_path))


async def group_of_one(tmp_path: Path) -> None:
    machine = ShardMachine(tmp_path / "shard", CONFIG)
    replica = RaftReplica(SHARD, ME, tmp_path / "shard", machine, None, voters=[ME],
                          bootstrap=True)
    await replica.start()
    try:
        await until(lambda: replica.is_leader() and replica._parked
                    and replica.raftLastApplied == replica.raftCommitIndex)
        answers: list[Proposal] = []
        replica.propose(create_queue("a"), lambda status, out: answers.append(status))
        # written, committed, applied and answered in this turn: no await in between
        assert answers == [Proposal.COMMITTED]
        assert replica.storage.log.last_index() == replica.raftLastApplied

        # A disk whose recent writes were slow: the write goes to the writer thread, and
        # the answer comes once it is durable.
        replica._write_s = 2 * readyloop.INLINE_WRITE_S
        writes = replica.writes.writes
        replica.propose(create_queue("b"), lambda status, out: answers.append(status))
        assert answers == [Proposal.COMMITTED]
        await until(lambda: len(answers) == 2)
        assert answers[1] is Proposal.COMMITTED and replica.writes.writes == writes + 1
    finally:
        await replica.stop()
        machine.close()


class Queued:
    """A peer transport that keeps what is sent (the host writes it at the read's end)."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    def send(self, node: str, address: object, shard: int, m: Message) -> None:
        self.sent.append(m)

    def flush_now(self) -> None:
        pass


def test_a_follower_writes_and_answers_the_appends_of_one_read_once_and_at_once(
        tmp_path: Path) -> None:
    asyncio.run(follower(tmp_path))


@asynccontextmanager
async def a_follower(tmp_path: Path, on_fatal: Callable[[BaseException], None] | None = None
                     ) -> AsyncIterator[tuple[RaftReplica, Replicas, Queued]]:
    """A follower of ``LEADER`` behind its node's ``Replicas``, its Ready loop parked."""
    machine = ShardMachine(tmp_path / "shard", CONFIG)
    replica = RaftReplica(SHARD, ME, tmp_path / "shard", machine, None,
                          voters=[ME, LEADER], bootstrap=True, on_fatal=on_fatal)
    transport = replica.transport = Queued()  # type: ignore[assignment]
    replicas = Replicas()
    replicas.by_shard[SHARD] = replica
    await replica.start()
    try:
        await until(lambda: replica._parked)
        yield replica, replicas, transport
    finally:
        await replica.stop()
        machine.close()


async def follower(tmp_path: Path) -> None:
    async with a_follower(tmp_path) as (replica, replicas, transport):
        a = RaftEntry(index=2, term=2, data=create_queue("a"))
        b = RaftEntry(index=3, term=2, data=create_queue("b"))
        persists = replica.persists
        # Two appends in one read (the leader sent the second before the first's answer).
        replicas.on_messages(LEADER, [
            (SHARD, Message(MsgType.APPEND, ME, LEADER, 2, log_term=1, index=1,
                            entries=(a,), commit=1)),
            (SHARD, Message(MsgType.APPEND, ME, LEADER, 2, log_term=2, index=2,
                            entries=(b,), commit=1))])
        assert replica.persists == persists  # stepped in, nothing acted on yet
        assert replicas.act()  # the read's end
        assert replica.persists == persists + 1  # one write for both
        assert replica.storage.log.last_index() == 3
        answers = [m.index for m in transport.sent if m.type is MsgType.APPEND_RESP]
        assert answers and answers[-1] == 3

        # Stepped in without a read's end (as a test or another caller may): acted on at
        # the end of the loop's turn all the same.
        transport.sent.clear()
        d = RaftEntry(index=4, term=2, data=create_queue("d"))
        replicas.on_messages(LEADER, [(SHARD, Message(
            MsgType.APPEND, ME, LEADER, 2, log_term=2, index=3, entries=(d,), commit=3))])
        await until(lambda: any(m.type is MsgType.APPEND_RESP and m.index == 4
                                for m in transport.sent))
        assert replica.storage.log.last_index() == 4


def test_a_follower_whose_disk_fails_as_it_acts_on_a_read_stops_and_answers_nothing(
        tmp_path: Path) -> None:
    """What the write raises stops the replica there (as the Ready loop's would), and goes
    no further: the transport's read is not failed, the leader gets no answer."""
    asyncio.run(follower_disk_fails(tmp_path))


async def follower_disk_fails(tmp_path: Path) -> None:
    stopped: list[BaseException] = []
    async with a_follower(tmp_path, stopped.append) as (replica, replicas, transport):
        def broken(entries: object, hard_state: object) -> None:
            raise OSError("the disk went away")
        replica.storage.persist = broken  # type: ignore[method-assign]
        a = RaftEntry(index=2, term=2, data=create_queue("a"))
        replicas.on_messages(LEADER, [(SHARD, Message(
            MsgType.APPEND, ME, LEADER, 2, log_term=1, index=1, entries=(a,), commit=1))])
        assert replicas.act()  # raises nothing
        assert isinstance(replica.fatal, OSError) and stopped == [replica.fatal]
        assert not [m for m in transport.sent if m.type is MsgType.APPEND_RESP]
