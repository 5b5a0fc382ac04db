"""The shard engine in process, over a one-member Raft group: what a poll leaves behind,
what a read sees, what happens to a command the log cannot carry."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from serverproc import free_port
from sqsq.api import Endpoint
from sqsq.core import commands as c
from sqsq.core.state import ShardConfig
from sqsq.errors import ErrorCode, QueueDoesNotExist, Rejection
from sqsq.shard.engine import ShardEngine
from sqsq.shard.host import Peer, ReplicaOptions, open_replica
from sqsq.shard.service import ShardService


async def _engine(directory: Path) -> ShardEngine:
    me = Peer("127.0.0.1", 0, free_port())
    engine = open_replica(0, directory, ShardConfig(0, b"k"), me, [me],
                          ReplicaOptions(bootstrap=True, memory=True))
    await engine.start()
    assert await engine.wait_leading(10.0)
    return engine


async def _own_entries_done(engine: ShardEngine) -> None:
    """Until the engine's own first entry (its configuration, ``Configure``, proposed by its
    sweep check at a tick after it leads) is applied and nothing of its own is out: a test
    that counts entries must not count that one. Under load the tick can come after the
    test's first commands."""
    while engine.machine.recorded_fingerprint() is None or engine.proposer.busy or \
            engine._sweeping is not None:
        await asyncio.sleep(0.005)


async def _turns(n: int = 20) -> None:
    for _ in range(n):  # let the proposer and its tasks run
        await asyncio.sleep(0)


async def _received_now(engine: ShardEngine) -> list[str]:
    """What a receive from "q" gets once the entries out (a release among them) are applied:
    a message still in flight is not among them (its visibility timeout is 30 s)."""
    while engine.proposer.busy:
        await asyncio.sleep(0.01)
    got = await engine.execute(c.ReceiveMessages("q", 10))
    assert isinstance(got, c.Received)
    return [m.body for m in got.messages]


def test_a_long_poll_on_a_missing_queue_leaves_nothing_parked(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = await _engine(tmp_path)
        api = ShardService(engine, Endpoint())
        for i in range(5):
            with pytest.raises(QueueDoesNotExist):
                await api.receive_message(f"made-up-{i}", wait_time_seconds=1)
        assert len(engine.waiters) == 0
        await api.create_queue("real")
        poll = asyncio.create_task(api.receive_message("real", wait_time_seconds=5))
        while len(engine.waiters) == 0:
            await asyncio.sleep(0.01)  # a poll on a real queue does park
        assert isinstance(await engine.execute(c.SendMessages(
            "real", (c.SendEntry("0", "hi"),))), c.BatchResult)
        assert [m.body for m in await poll] == ["hi"]
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_applied_index_is_the_raft_index_and_reads_see_acknowledged_writes(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = await _engine(tmp_path)
        api = ShardService(engine, Endpoint())
        await asyncio.gather(*(api.create_queue(f"q{i}") for i in range(20)))
        urls, _ = await api.list_queues()
        assert len(urls) == 20
        # The replica counts an entry applied just after the state machine's apply returns.
        for _ in range(500):
            if engine.applied_index == engine.replica.raftLastApplied:
                break
            await asyncio.sleep(0.01)
        assert engine.applied_index == engine.replica.raftLastApplied  # entries, not commands
        assert engine.machine.meta().applied_index == engine.applied_index
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_quiet_one_member_group_stops_its_clock_until_the_next_command(
        tmp_path: Path) -> None:
    """``sqsq server``'s group has one member: once it is quiet its ticks would do nothing,
    so its clock waits for the next command (an idle server woke 20 times a second for
    them), and counts again from it."""
    async def scenario() -> None:
        engine = await _engine(tmp_path)
        replica, core = engine.replica, engine.replica.core
        assert core is not None
        ticks = [0]
        tick = replica.tick

        def counted() -> None:
            ticks[0] += 1
            tick()

        replica.tick = counted  # type: ignore[method-assign]

        async def clock_stopped() -> asyncio.Event:
            while (stopped := replica._clock_stopped) is None:
                await asyncio.sleep(0.01)  # the group goes quiet after 2 s with nothing to do
            return stopped

        stopped = await clock_stopped()
        assert core.quiesced and not stopped.is_set()
        await engine.execute(c.CreateQueue("q"))  # a command wakes the group and its clock
        assert stopped.is_set() and not core.quiesced
        before = ticks[0]
        while ticks[0] < before + 2:
            await asyncio.sleep(0.01)  # it ticks again
        assert isinstance(await engine.execute(c.SendMessages(
            "q", (c.SendEntry("0", "hi"),))), c.BatchResult)
        again = await clock_stopped()  # and stops once quiet again
        assert again is not stopped and core.quiesced
        got = await engine.execute(c.ReceiveMessages("q", 10))
        assert isinstance(got, c.Received) and [m.body for m in got.messages] == ["hi"]
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_commands_arriving_while_an_entry_is_in_flight_share_the_next_entry(
        tmp_path: Path) -> None:
    """Under a moderate load (each shard's share of a cluster's clients) a command that finds
    an entry in flight waits for it and goes with the others that arrived meanwhile: one
    entry for all of them, not one each (the per-entry cost of replication dominated a
    cluster of four shards). Only a long queue of waiting commands opens a second entry
    beside the first (``PIPELINE_GROUP``)."""
    from sqsq.shard.proposer import PIPELINE_GROUP

    async def scenario() -> None:
        engine = await _engine(tmp_path)
        await engine.execute(c.CreateQueue("q"))
        await _own_entries_done(engine)  # (its Configure had made the eighth command waiting)
        replica, proposed, held = engine.replica, [], []
        propose = replica.propose

        def gated(data: bytes, on_done: object) -> None:
            proposed.append(data)
            if len(proposed) == 1:
                held.append((data, on_done))  # the first entry stays in flight
            else:
                propose(data, on_done)

        replica.propose = gated  # type: ignore[method-assign]
        send = [asyncio.create_task(engine.execute(c.SendMessages(
            "q", (c.SendEntry("0", "first"),))))]
        while not proposed:  # under load it can take more than a few turns to go out
            await asyncio.sleep(0.001)
        for i in range(PIPELINE_GROUP - 1):  # each in a turn of its own
            send.append(asyncio.create_task(engine.execute(c.SendMessages(
                "q", (c.SendEntry("0", f"later {i}"),)))))
            await _turns()
        assert len(proposed) == 1  # the later ones wait for the first
        propose(*held[0])
        results = await asyncio.gather(*send)
        assert all(isinstance(r, c.BatchResult) and r.successful for r in results)
        assert len(proposed) == 2  # and went in one entry
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_command_the_log_cannot_carry_is_refused_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = await _engine(tmp_path)
        await engine.execute(c.CreateQueue("q"))
        bad = c.SendMessages("q", (c.SendEntry("0", "x", delay_seconds=10**30),))
        good = c.SendMessages("q", (c.SendEntry("0", "y"),))
        results = await asyncio.gather(engine.execute(bad), engine.execute(good))
        assert isinstance(results[0], Rejection)
        assert results[0].code is ErrorCode.INVALID_PARAMETER_VALUE
        assert isinstance(results[1], c.BatchResult) and results[1].successful
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_receive_at_a_lagging_follower_answers_not_leader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower that has not applied a queue's creation yet: a receive without
    WaitTimeSeconds must send the client to the leader, not tell it the queue is gone."""
    from sqsq.errors import NotLeader

    async def scenario() -> None:
        engine = await _engine(tmp_path)  # its state lacks the queue: it lags
        api = ShardService(engine, Endpoint())
        monkeypatch.setattr(engine.replica, "is_leader", lambda: False)
        monkeypatch.setattr(engine.replica, "leader_address", lambda: "127.0.0.1:1")
        with pytest.raises(NotLeader):
            await api.receive_message("created-at-the-leader")
        monkeypatch.undo()
        with pytest.raises(QueueDoesNotExist):  # where it leads, the queue is looked for
            await api.receive_message("created-at-the-leader")
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_receive_at_a_leader_that_has_not_applied_the_queue_yet_finds_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Just after an election, a leader's state may lack a queue created and acknowledged a
    moment before: the receive looks for it again after a barrier instead of answering
    NonExistentQueue from what it has applied so far."""
    from sqsq.core.queues import queue_does_not_exist

    async def scenario() -> None:
        engine = await _engine(tmp_path)
        api = ShardService(engine, Endpoint())
        await api.create_queue("fresh")
        await api.send_message_batch("fresh", [c.SendEntry("0", "hi")])
        real, lagging = engine.query, [True]

        def query(fn, *args):  # noqa: ANN001, ANN202 - the first look: not applied yet
            if lagging:
                lagging.pop()
                return queue_does_not_exist()
            return real(fn, *args)

        monkeypatch.setattr(engine, "query", query)
        assert [m.body for m in await api.receive_message("fresh")] == ["hi"]
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_receive_whose_caller_left_after_it_went_out_releases_its_messages(
        tmp_path: Path) -> None:
    """A long poll that another partition's answered first is cancelled by the gateway; if
    its receive was already in the log, the messages it took are visible again at once,
    not in flight for nobody until their visibility timeout (30 s here) ends."""
    async def scenario() -> None:
        engine = await _engine(tmp_path)
        await engine.execute(c.CreateQueue("q"))
        await engine.execute(c.SendMessages("q", (c.SendEntry("0", "taken"),)))
        poll = engine.submit(c.ReceiveMessages("q", 10))
        await asyncio.sleep(0)  # the proposer's flush: the receive's entry goes out
        assert engine.proposer.busy and not poll.done(), "the entry is out, not yet applied"
        poll.cancel()
        assert await _received_now(engine) == ["taken"]
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_command_whose_caller_left_before_it_went_out_is_not_proposed(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = await _engine(tmp_path)
        await engine.execute(c.CreateQueue("q"))
        send = engine.submit(c.SendMessages("q", (c.SendEntry("0", "never"),)))
        send.cancel()  # before the proposer's flush (at the end of this turn)
        await _turns()
        assert await _received_now(engine) == []  # the send never applied
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_receive_answered_as_its_caller_left_releases_its_messages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The receive's entry applied and its future answered, and the cancel arriving before
    the call resumed with the answer: the messages are released, not left in flight."""
    async def scenario() -> None:
        engine = await _engine(tmp_path)
        await engine.execute(c.CreateQueue("q"))
        await engine.execute(c.SendMessages("q", (c.SendEntry("0", "taken"),)))
        answer = asyncio.get_running_loop().create_future()
        took = await engine.execute(c.ReceiveMessages("q", 10))  # what the entry gave
        monkeypatch.setattr(engine, "submit", lambda command: answer)
        monkeypatch.setattr(engine, "_counted_visible", lambda queue: True)
        poll = asyncio.ensure_future(engine.receive(c.ReceiveMessages("q", 10)))
        await asyncio.sleep(0)  # the poll waits for its answer
        answer.set_result(took)
        poll.cancel()  # before the poll resumed with it
        with pytest.raises(asyncio.CancelledError):
            await poll
        monkeypatch.undo()
        await _turns()
        assert await _received_now(engine) == ["taken"]
        await engine.stop()

    asyncio.run(asyncio.wait_for(scenario(), 60))
