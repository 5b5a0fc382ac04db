"""The Ready loop pipelines: committed entries are applied (and their proposals answered)
while the next batch is still being persisted, and a leader's appends leave before its own
write of them is durable, while what answers a peer still waits for the disk; a Ready that
only moves the commit index writes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from sqsq.core import commands as c
from sqsq.core.entry import Entry, encode_entry
from sqsq.core.state import ShardConfig
from sqsq.raft import Entry as RaftEntry
from sqsq.raft import HardState, Message, MsgType, Ready, Role
from sqsq.shard import readyloop
from sqsq.shard.replica import HostSettings, Proposal, RaftReplica
from sqsq.shard.statemachine import ShardMachine

SHARD = 1
CONFIG = ShardConfig(shard_id=SHARD, secret=b"s" * 32)
ME = "127.0.0.1:7001"
TIMEOUT_S = 20.0


async def until(done: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not done():
            await asyncio.sleep(0.01)


class GatedPersist:
    """The storage's ``persist``, held at a gate per call once ``hold`` is set: a disk as
    slow as the test wants."""

    def __init__(self, persist: Callable[..., None]) -> None:
        self.persist = persist
        self.hold = False
        self.gates: list[threading.Event] = []
        self.entered: list[list[int]] = []  # each held call's entry indexes
        self.calls = 0

    def __call__(self, entries: tuple, hard_state: object) -> None:
        self.calls += 1
        if self.hold and entries:
            gate = threading.Event()
            self.gates.append(gate)
            self.entered.append([e.index for e in entries])
            gate.wait(3 * TIMEOUT_S)  # past any wait of the test: it releases them
        self.persist(entries, hard_state)


def create_queue(name: str) -> bytes:
    return encode_entry(Entry(1_000, (c.CreateQueue(name),)))


def test_apply_proceeds_while_the_next_batch_is_being_persisted(tmp_path: Path) -> None:
    asyncio.run(apply_while_persisting(tmp_path))


async def apply_while_persisting(tmp_path: Path) -> None:
    machine = ShardMachine(tmp_path / "shard", CONFIG)
    replica = RaftReplica(SHARD, ME, tmp_path / "shard", machine, None, voters=[ME],
                          bootstrap=True, settings=HostSettings(durable=False))
    await replica.start()
    try:
        await until(replica.is_leader)
        loop = asyncio.get_running_loop()
        settled: asyncio.Future = loop.create_future()  # the leader's no-op is written too
        replica.propose(create_queue("z"), lambda s, out: settled.set_result(s))
        assert await asyncio.wait_for(settled, TIMEOUT_S) is Proposal.COMMITTED
        gated = GatedPersist(replica.storage.persist)
        replica.storage.persist = gated  # type: ignore[method-assign]
        gated.hold = True
        replica._write_s = 1.0  # a slow disk: held at the gate, no write runs on the loop
        first: asyncio.Future = loop.create_future()
        second: asyncio.Future = loop.create_future()
        replica.propose(create_queue("a"), lambda s, out: first.set_result(s))
        await until(lambda: len(gated.gates) == 1)  # A's write is under way
        replica.propose(create_queue("b"), lambda s, out: second.set_result(s))
        gated.gates[0].set()  # A durable: committed; B is written next
        await until(lambda: len(gated.gates) == 2)
        # B's write is held, yet A is applied and answered meanwhile.
        assert await asyncio.wait_for(first, TIMEOUT_S) is Proposal.COMMITTED
        assert not second.done() and not gated.gates[1].is_set()
        assert replica.raftLastApplied == gated.entered[0][-1]
        gated.gates[1].set()
        assert await asyncio.wait_for(second, TIMEOUT_S) is Proposal.COMMITTED
        assert replica.raftLastApplied == gated.entered[1][-1]
    finally:
        for gate in getattr(replica.storage.persist, "gates", []):
            gate.set()
        await replica.stop()
        machine.close()


class Sent:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    def send(self, node: str, address: object, shard: int, m: Message) -> None:
        self.messages.append(m)

    def flush_now(self) -> None:
        pass  # (``send`` wrote it already)


def message(kind: MsgType, to: str) -> Message:
    return Message(type=kind, to=to, frm=ME, term=2)


def test_a_leader_sends_appends_before_its_write_and_answers_after(tmp_path: Path) -> None:
    asyncio.run(send_early(tmp_path))


async def send_early(tmp_path: Path) -> None:
    machine = ShardMachine(tmp_path / "shard", CONFIG)
    replica = RaftReplica(SHARD, ME, tmp_path / "shard", machine, None, voters=[ME],
                          bootstrap=True)
    sent = Sent()
    replica.transport = sent  # type: ignore[assignment]
    gated = GatedPersist(replica.storage.persist)
    replica.storage.persist = gated  # type: ignore[method-assign]
    gated.hold = True
    replica._write_s = 1.0  # a slow disk: held at the gate, no write runs on the loop
    replica._term_vote = (2, ME)
    entry = RaftEntry(index=1, term=2, data=b"x")
    peer = "127.0.0.1:7101"
    try:
        async def handled(rd: Ready) -> None:
            task = asyncio.create_task(replica._handle(rd))
            await until(lambda: len(gated.gates) == len(handled.calls) + 1)
            handled.calls.append(list(sent.messages))
            gated.gates[-1].set()
            await task
        handled.calls = []  # type: ignore[attr-defined]
        # A leader in its (durable) term: the append goes before its own write is done,
        # the answer to a candidate after.
        await handled(Ready(hard_state=HardState(2, ME, 4), entries=(entry,),
                            messages=(message(MsgType.APPEND, peer),
                                      message(MsgType.VOTE_RESP, peer)),
                            role=Role.LEADER))
        assert [m.type for m in handled.calls[0]] == [MsgType.APPEND]
        assert [m.type for m in sent.messages] == [MsgType.APPEND, MsgType.VOTE_RESP]
        # A Ready that changes the term or vote sends nothing before it is durable.
        sent.messages.clear()
        await handled(Ready(hard_state=HardState(3, ME, 4),
                            entries=(RaftEntry(index=2, term=3, data=b"y"),),
                            messages=(message(MsgType.APPEND, peer),), role=Role.LEADER))
        assert handled.calls[1] == [] and len(sent.messages) == 1
        # A follower's answer waits for its write.
        sent.messages.clear()
        await handled(Ready(entries=(RaftEntry(index=3, term=3, data=b"z"),),
                            messages=(message(MsgType.APPEND_RESP, peer),)))
        assert handled.calls[2] == [] and len(sent.messages) == 1
        # One that only moves the commit index writes nothing: its messages go at once.
        sent.messages.clear()
        calls = gated.calls
        await replica._handle(Ready(hard_state=HardState(3, ME, 3),
                                    messages=(message(MsgType.APPEND_RESP, peer),)))
        assert gated.calls == calls and len(sent.messages) == 1
    finally:
        for gate in gated.gates:
            gate.set()
        replica.storage.close()
        machine.close()


class Wire:
    """A peer transport that writes what was sent at the end of the loop's turn, as the
    real one does, noting each answer as it leaves beside the state machine's applies."""

    def __init__(self, events: list[tuple[str, int]]) -> None:
        self.events = events
        self.queued: list[Message] = []

    def send(self, node: str, address: object, shard: int, m: Message) -> None:
        self.queued.append(m)
        asyncio.get_running_loop().call_soon(self.flush_now)

    def flush_now(self) -> None:
        self.events += [("answer", m.index) for m in self.queued
                        if m.type is MsgType.APPEND_RESP]
        self.queued.clear()


def test_a_follower_answers_an_append_before_it_applies(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader's commit waits for the follower's answer, and nothing waits for its
    apply: an append that also commits entries the follower holds is answered first. On a
    fast disk, that is: once a write takes long enough to go to the writer thread, what is
    already durable is applied while it runs (``test_apply_proceeds_while_...``); a slow
    first fsync on a busy machine made this test take that path."""
    monkeypatch.setattr(readyloop, "INLINE_WRITE_S", 3600.0)
    asyncio.run(answers_first(tmp_path))


LEADER = "127.0.0.1:7101"


@contextlib.asynccontextmanager
async def _follower(tmp_path: Path) -> AsyncIterator[
        tuple[ShardMachine, RaftReplica, list[tuple[str, int]]]]:
    """A follower of ``LEADER``, started, whose answers are noted in the events it gives as
    they leave (``Wire``); stopped on the way out."""
    machine = ShardMachine(tmp_path / "shard", CONFIG)
    replica = RaftReplica(SHARD, ME, tmp_path / "shard", machine, None, voters=[ME, LEADER],
                          bootstrap=True)
    events: list[tuple[str, int]] = []
    replica.transport = Wire(events)  # type: ignore[assignment]
    await replica.start()
    try:
        yield machine, replica, events
    finally:
        await replica.stop()
        machine.close()


async def answers_first(tmp_path: Path) -> None:
    async with _follower(tmp_path) as (machine, replica, events):
        apply_entry = machine.apply_entry

        def applying(index: int, data: bytes) -> object:
            events.append(("apply", index))
            return apply_entry(index, data)
        machine.apply_entry = applying  # type: ignore[method-assign]
        a = RaftEntry(index=2, term=2, data=create_queue("a"))
        b = RaftEntry(index=3, term=2, data=create_queue("b"))
        replica.step(Message(MsgType.APPEND, ME, LEADER, 2, log_term=1, index=1,
                             entries=(a,), commit=1))
        await until(lambda: ("answer", 2) in events)
        # b, and the commit of a (durable here already)
        replica.step(Message(MsgType.APPEND, ME, LEADER, 2, log_term=2, index=2,
                             entries=(b,), commit=2))
        await until(lambda: ("apply", 2) in events and ("answer", 3) in events)
        assert events.index(("answer", 3)) < events.index(("apply", 2))


def test_a_follower_answer_leaves_as_soon_as_its_write_is_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not at the end of the loop's turn: the leader's commit waits for it, and what the
    Ready loop does next (the core's advance, the applies handed over, other shards' Readys
    with their fsyncs) need not go first."""
    monkeypatch.setattr(readyloop, "INLINE_WRITE_S", 3600.0)  # (the write on the loop)
    asyncio.run(answer_at_once(tmp_path))


async def answer_at_once(tmp_path: Path) -> None:
    async with _follower(tmp_path) as (_, replica, events):
        core = replica.core
        assert core is not None
        advance = core.advance

        def advancing(rd: Ready) -> None:
            events.extend(("advance", e.index) for e in rd.entries)
            advance(rd)
        core.advance = advancing  # type: ignore[method-assign]
        a = RaftEntry(index=2, term=2, data=create_queue("a"))
        replica.step(Message(MsgType.APPEND, ME, LEADER, 2, log_term=1, index=1,
                             entries=(a,), commit=1))
        await until(lambda: ("answer", 2) in events and ("advance", 2) in events)
        assert events.index(("answer", 2)) < events.index(("advance", 2))


def test_a_leader_whose_store_fails_to_apply_stops(tmp_path: Path) -> None:
    """Applied in the Ready loop's own turn or by the applier, an entry the store cannot
    take stops the replica: it never skips the entry and goes on."""
    asyncio.run(store_fails(tmp_path))


async def store_fails(tmp_path: Path) -> None:
    machine = ShardMachine(tmp_path / "shard", CONFIG)
    stopped: list[BaseException] = []
    replica = RaftReplica(SHARD, ME, tmp_path / "shard", machine, None, voters=[ME],
                          bootstrap=True, settings=HostSettings(durable=False),
                          on_fatal=stopped.append)
    await replica.start()
    try:
        await until(replica.is_leader)

        def broken(index: int, data: bytes) -> object:
            raise OSError("the disk went away")
        machine.apply_entry = broken  # type: ignore[method-assign]
        replica.propose(create_queue("a"), lambda status, outcomes: None)
        await until(lambda: bool(stopped))
        assert isinstance(replica.fatal, OSError) and stopped == [replica.fatal]
        assert not replica.is_leader()
        answers: list[Proposal] = []
        replica.propose(create_queue("b"), lambda status, outcomes: answers.append(status))
        assert answers == [Proposal.NOT_LEADER]
    finally:
        await replica.stop()
        machine.close()


def test_a_follower_whose_store_fails_to_apply_stops(tmp_path: Path) -> None:
    """A follower applies a small batch in a callback of its own, not the applier's task:
    an entry its store cannot take stops it there too."""
    asyncio.run(follower_store_fails(tmp_path))


async def follower_store_fails(tmp_path: Path) -> None:
    machine = ShardMachine(tmp_path / "shard", CONFIG)
    leader = "127.0.0.1:7101"
    stopped: list[BaseException] = []
    replica = RaftReplica(SHARD, ME, tmp_path / "shard", machine, None, voters=[ME, leader],
                          bootstrap=True, settings=HostSettings(durable=False),
                          on_fatal=stopped.append)
    events: list[tuple[str, int]] = []
    replica.transport = Wire(events)  # type: ignore[assignment]

    def broken(index: int, data: bytes) -> object:
        raise OSError("the disk went away")
    machine.apply_entry = broken  # type: ignore[method-assign]
    await replica.start()
    try:
        a = RaftEntry(index=2, term=2, data=create_queue("a"))
        replica.step(Message(MsgType.APPEND, ME, leader, 2, log_term=1, index=1,
                             entries=(a,), commit=2))
        await until(lambda: bool(stopped))
        assert isinstance(replica.fatal, OSError) and stopped == [replica.fatal]
        assert replica.raftLastApplied < 2
    finally:
        await replica.stop()
        machine.close()
