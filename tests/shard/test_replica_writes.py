"""Where a Ready's write runs: a node's writes batched into worker-thread calls (``Writes``),
and a small write on the event loop while the disk is fast (a leader's once its appends are
written, and only when it has nothing of the Ready to apply meanwhile)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from sqsq.core.state import ShardConfig
from sqsq.raft import Entry, HardState, Message, MsgType, Ready, Role
from sqsq.shard import raftstorage, readyloop
from sqsq.shard.raftstorage import Writes
from sqsq.shard.replica import RaftReplica
from sqsq.shard.statemachine import ShardMachine

SHARD = 1
CONFIG = ShardConfig(shard_id=SHARD, secret=b"s" * 32)
ME = "127.0.0.1:7001"


def test_writes_asked_for_in_one_turn_share_one_worker_call_in_order() -> None:
    asyncio.run(one_call_per_turn())


async def one_call_per_turn() -> None:
    writes = Writes()
    done: list[tuple[str, str]] = []

    def write(name: str) -> str:
        done.append((name, threading.current_thread().name))
        return name

    def broken() -> None:
        raise OSError("disk gone")

    first = [writes.run(lambda n=n: write(n)) for n in ("a", "b")]
    failing = writes.run(broken)
    last = writes.run(lambda: write("c"))
    assert await asyncio.gather(*first) == ["a", "b"]
    with pytest.raises(OSError, match="disk gone"):
        await failing
    assert await last == "c"  # a failed write fails its own caller only
    assert [n for n, _ in done] == ["a", "b", "c"]
    assert len({t for _, t in done}) == 1 and done[0][1] != threading.current_thread().name
    assert (writes.batches, writes.writes) == (1, 4)


def test_writes_asked_for_while_a_call_runs_go_together_in_the_next() -> None:
    asyncio.run(next_call())


async def next_call() -> None:
    writes = Writes()
    gate, entered = threading.Event(), threading.Event()

    def held() -> str:
        entered.set()
        gate.wait(20)
        return "held"

    first = writes.run(held)
    await asyncio.to_thread(entered.wait, 20)
    later = [writes.run(lambda n=n: n) for n in range(3)]
    gate.set()
    assert await first == "held" and await asyncio.gather(*later) == [0, 1, 2]
    assert (writes.batches, writes.writes) == (2, 4)


class Disk:
    """The storage's ``persist``, recording the thread each write ran in, on a clock that
    each write moves by ``takes_s`` (a disk as fast or slow as the test says)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.takes_s = 0.0001
        self.threads: list[str] = []

    def monotonic(self) -> float:
        return self.now

    def persist(self, entries: object, hard_state: object) -> None:
        self.threads.append(threading.current_thread().name)
        self.now += self.takes_s


class Wire:
    """A peer transport that notes, against the disk's writes, when what was sent to it
    was written to the network."""

    def __init__(self, disk: Disk) -> None:
        self.disk = disk
        self.queued: list[MsgType] = []
        self.written: list[tuple[MsgType, int]] = []  # (type, disk writes before it left)

    def send(self, node: str, address: object, shard_id: int, m: Message) -> None:
        self.queued.append(m.type)
        asyncio.get_running_loop().call_soon(self.flush_now)  # as the transport does

    def flush_now(self) -> None:
        self.written += [(t, len(self.disk.threads)) for t in self.queued]
        self.queued.clear()


def test_a_followers_write_runs_on_the_loop_while_the_disk_is_fast(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = Disk()
    monkeypatch.setattr(readyloop, "time", disk)
    asyncio.run(inline_while_fast(tmp_path, disk))


async def inline_while_fast(tmp_path: Path, disk: Disk) -> None:
    machine = ShardMachine(tmp_path / "shard", CONFIG)
    replica = RaftReplica(SHARD, ME, tmp_path / "shard", machine, None, voters=[ME],
                          bootstrap=True)
    replica.storage.persist = disk.persist  # type: ignore[method-assign]
    loop_thread = threading.current_thread().name
    index = iter(range(1, 1000))

    async def write(role: Role, size: int = 10, committed: tuple[Entry, ...] = ()) -> str:
        entry = Entry(index=next(index), term=2, data=b"x" * size)
        resp = Message(MsgType.APPEND_RESP, "127.0.0.1:7101", ME, 2)
        await replica._handle(Ready(hard_state=HardState(2, None, 0), entries=(entry,),
                                    messages=(resp,), committed=committed, role=role))
        return "loop" if disk.threads[-1] == loop_thread else "worker"

    try:
        replica._term_vote = (2, None)  # durable already: a leader's appends may go early
        assert await write(Role.FOLLOWER) == "loop"
        assert await write(Role.LEADER) == "loop"
        # a leader with committed entries to apply does that while a worker writes
        old = Entry(index=next(index), term=2)
        assert await write(Role.LEADER, committed=(old,)) == "worker"
        # and so does a leader with another entry out besides the Ready's own
        for i in (1000, 1001):
            replica._proposals[i] = (2, lambda status, outcomes: None)
        assert await write(Role.LEADER) == "worker"
        replica._proposals.clear()
        big = readyloop.INLINE_WRITE_BYTES + 1
        assert await write(Role.FOLLOWER, big) == "worker"
        disk.takes_s = 0.02  # the disk slows down: after a few writes, off the loop
        where = [await write(Role.FOLLOWER) for _ in range(10)]
        assert where[0] == "loop" and where[-1] == "worker"
        disk.takes_s = 0.0001  # and back on it once the disk is fast again
        where = [await write(Role.FOLLOWER) for _ in range(40)]
        assert where[-1] == "loop"
    finally:
        replica.storage.close()
        machine.close()


def test_a_leader_writing_on_the_loop_has_sent_its_appends_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader's appends are on the network before its loop blocks on its own write (the
    followers write their copies meanwhile); what answers a peer waits for the write."""
    disk = Disk()
    monkeypatch.setattr(readyloop, "time", disk)
    asyncio.run(appends_first(tmp_path, disk))


async def appends_first(tmp_path: Path, disk: Disk) -> None:
    machine = ShardMachine(tmp_path / "shard", CONFIG)
    wire = Wire(disk)
    replica = RaftReplica(SHARD, ME, tmp_path / "shard", machine, wire,  # type: ignore[arg-type]
                          voters=[ME], bootstrap=True)
    replica.storage.persist = disk.persist  # type: ignore[method-assign]
    replica._term_vote = (2, ME)
    peer = "127.0.0.1:7101"
    try:
        entry = Entry(index=1, term=2, data=b"x")
        await replica._handle(Ready(
            hard_state=HardState(2, ME, 0), entries=(entry,), role=Role.LEADER, messages=(
                Message(MsgType.APPEND, peer, ME, 2, entries=(entry,)),
                Message(MsgType.VOTE_RESP, peer, ME, 2))))
        await asyncio.sleep(0)
        assert disk.threads == [threading.current_thread().name]  # written on the loop
        assert wire.written == [(MsgType.APPEND, 0), (MsgType.VOTE_RESP, 1)]
    finally:
        replica.storage.close()
        machine.close()


def test_the_writer_thread_ends_when_idle_and_the_next_batch_starts_another(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(idle_writer(monkeypatch))


async def idle_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raftstorage, "WRITER_IDLE_S", 0.01)
    writes = Writes()
    assert await writes.run(lambda: threading.current_thread().name) == "raft-writes"
    writer = writes._writer
    assert writer is not None
    await asyncio.to_thread(writer.join, 20)  # nothing more to write: it ended
    assert not writer.is_alive() and writes._writer is None
    async with asyncio.timeout(20):  # a batch left to a writer that ended would hang
        assert await writes.run(lambda: "again") == "again"
