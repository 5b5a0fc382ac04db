"""A leader works out the apply of an entry it proposed while its followers write theirs
(``ShardMachine.prepare``), and once the entry is committed writes what that gave. The store
and the answers must be exactly those of applying the entry then; and what was prepared must
never stand in for another entry committed at its index."""

from __future__ import annotations

import asyncio
from pathlib import Path

from shardgroup import Group, run
from sqsq.api import Endpoint
from sqsq.core import commands as c
from sqsq.core.entry import Entry, encode_entry
from sqsq.core.state import ShardConfig
from sqsq.raft import Entry as LogEntry
from sqsq.shard.host import ReplicaOptions
from sqsq.shard.replica import RaftReplica
from sqsq.shard.service import ShardService
from sqsq.shard.statemachine import ShardMachine

CONFIG = ShardConfig(5, b"k" * 32)
EVERYTHING = (b"", b"\xff" * 8)


def machine(path: Path) -> ShardMachine:
    return ShardMachine(path, CONFIG, memory=True)


def entry(now_ms: int, *commands: c.Command) -> bytes:
    return encode_entry(Entry(now_ms, commands))


def send(queue: str, n: int, **fields: object) -> c.SendMessages:
    return c.SendMessages(queue, tuple(c.SendEntry(str(i), f"body-{n}-{i}", **fields)
                                       for i in range(3)),
                          request_id=f"r{n}", message_ids=tuple(f"m-{n}-{i}" for i in range(3)))


def test_an_entry_prepared_ahead_applies_as_applying_it_would(tmp_path: Path) -> None:
    """Sends (standard, FIFO with a duplicate, a retried request), receives, deletes and
    visibility changes: each entry applied on one machine, prepared then applied on the
    other. The same answers, the same store, byte for byte."""
    applying, preparing = machine(tmp_path / "a"), machine(tmp_path / "p")
    now = 1_000

    def both(*commands: c.Command) -> list[c.Outcome]:
        nonlocal now
        now += 250
        data, index = entry(now, *commands), applying.applied_index + 1
        applied = applying.apply_entry_writes(index, data)
        prepared = preparing.prepare(index, data)
        assert applied is not None and prepared is not None
        assert preparing.applied_index == index - 1  # nothing written yet
        assert preparing.apply_prepared(prepared) == applied
        assert list(preparing.store.scan(*EVERYTHING)) == list(applying.store.scan(*EVERYTHING))
        assert (preparing.applied_index, preparing.last_now_ms) == (
            applying.applied_index, applying.last_now_ms)
        return applied[0]

    both(c.CreateQueue("jobs"), c.CreateQueue("jobs.fifo", (("FifoQueue", "true"),)))
    both(send("jobs", 1), send("jobs", 1))  # the retry answers as the first
    both(send("jobs.fifo", 2, message_group_id="g", message_deduplication_id="d"),
         send("jobs.fifo", 3, message_group_id="g", message_deduplication_id="d"))
    [got] = both(c.ReceiveMessages("jobs", 10, nonce=7))
    assert isinstance(got.result, c.Received) and len(got.result.messages) == 3
    first, second, third = (m.receipt_handle for m in got.result.messages)
    both(c.DeleteMessages("jobs", (("0", first),)),
         c.ChangeVisibilities("jobs", (("1", second, 0),)))
    both(c.DeleteMessages("jobs", (("0", first), ("1", third))), send("jobs", 4))


def test_only_the_entry_after_the_applied_one_is_prepared(tmp_path: Path) -> None:
    m = machine(tmp_path)
    m.apply_entry(1, entry(1_000, c.CreateQueue("jobs")))
    assert m.prepare(3, entry(2_000, send("jobs", 1))) is None  # 2 is not applied yet
    assert m.prepare(1, entry(2_000, send("jobs", 1))) is None  # applied already
    assert m.prepare(2, entry(2_000, c.Configure(CONFIG.fingerprint()))) is None


def with_a_queue(tmp_path: Path) -> tuple[ShardMachine, RaftReplica]:
    """A machine that applied entry 1 (a queue created), and a replica (never started) whose
    applier applies to it."""
    m = machine(tmp_path)
    m.apply_entry(1, entry(1_000, c.CreateQueue("jobs")))
    return m, RaftReplica(5, "127.0.0.1:1", tmp_path / "r", m, None, voters=["127.0.0.1:1"],
                          bootstrap=True)


def test_what_was_prepared_never_stands_in_for_another_entry(tmp_path: Path) -> None:
    """The entry committed at an index is Raft's to say: one prepared there by a leader that
    lost its lead is not the committed one. The applier writes what it prepared only for the
    very entry; otherwise it applies the committed entry."""
    m, replica = with_a_queue(tmp_path)
    ours, committed = entry(2_000, send("jobs", 1)), entry(2_000, send("jobs", 2))
    prepared = m.prepare(2, ours)
    assert prepared is not None
    replica._prepared[2] = prepared
    results, _ = replica._apply_batch([LogEntry(2, 3, committed)], True, {})
    assert replica.prepared_used == 0
    sent = results[2][0].result
    assert isinstance(sent, c.BatchResult) and [e.message_id for e in sent.successful] == [
        "m-2-0", "m-2-1", "m-2-2"]
    assert m.applied_index == 2
    bodies = {v for _, v in m.store.scan(*EVERYTHING)}
    assert not any(b"body-1-" in v for v in bodies)
    assert any(b"body-2-0" in v for v in bodies)


def test_a_prepared_entry_is_not_written_over_a_store_that_moved(tmp_path: Path) -> None:
    """Prepared over the store at index 1; the store then moved past it (as a snapshot
    installed would move it): what was prepared is stale and is not written."""
    m, replica = with_a_queue(tmp_path)
    data = entry(2_000, send("jobs", 1))
    prepared = m.prepare(2, data)
    assert prepared is not None
    replica._prepared[2] = prepared
    m.apply_entry(2, entry(1_500, send("jobs", 9)))
    before = list(m.store.scan(*EVERYTHING))
    results, _ = replica._apply_batch([LogEntry(2, 3, data)], True, {})
    assert replica.prepared_used == 0 and results == {}
    assert list(m.store.scan(*EVERYTHING)) == before


def test_a_leader_answers_from_what_it_prepared_and_its_followers_end_identical(
        tmp_path: Path) -> None:
    async def scenario(group: Group) -> None:
        lead = await group.settled_leader()
        api = ShardService(lead, Endpoint())
        await api.create_queue("jobs")
        for n in range(30):  # one call at a time: each entry alone, as a lone sender's
            await api.send_message_batch("jobs", [c.SendEntry("0", f"m{n}")])
        got = await api.receive_message("jobs", max_number_of_messages=10)
        await api.delete_message_batch("jobs", [(str(i), m.receipt_handle)
                                                for i, m in enumerate(got)])
        assert lead.replica.prepared_used >= 25
        end = lead.replica.raftCommitIndex
        for engine in group.engines:
            while engine.replica.raftLastApplied < end:
                await asyncio.sleep(0.01)
        dumps = [list(e.machine.store.scan(*EVERYTHING)) for e in group.engines]
        assert dumps[0] == dumps[1] == dumps[2]

    run(scenario, tmp_path, ReplicaOptions(bootstrap=True, memory=True))


def test_a_leader_prepares_its_entry_before_it_writes_its_own_copy(tmp_path: Path) -> None:
    """The apply is worked out beside the followers' writes and before the leader's own:
    after it, the first follower's answer, which comes while the leader writes, waited for
    the prepare too."""
    async def scenario(group: Group) -> None:
        lead = await group.settled_leader()
        api = ShardService(lead, Endpoint())
        await api.create_queue("jobs")
        replica = lead.replica
        storage = replica.storage
        persist = storage.persist
        seen: list[bool] = []  # per write of an entry this leader proposed: prepared by then

        def watched(entries: list[LogEntry], hs: object) -> None:
            mine = [e.index for e in entries if e.index in replica._proposals]
            if mine:
                seen.append(all(i in replica._prepared for i in mine))
            persist(entries, hs)
        storage.persist = watched
        for n in range(30):  # one call at a time: each entry alone, as a lone sender's
            await api.send_message_batch("jobs", [c.SendEntry("0", f"m{n}")])
        assert len(seen) >= 25 and seen.count(True) >= 25, seen

    run(scenario, tmp_path, ReplicaOptions(bootstrap=True, memory=True))
