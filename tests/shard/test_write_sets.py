"""A leader shares what applying each entry wrote, and its followers write that instead of
applying the entry's commands again. The followers' stores must end byte for byte the
leader's, and a write set that is not the entry's (another index, another term, bad bytes)
must never be written: the follower applies the entry itself."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shardgroup import Group, run, until
from sqsq.api import Endpoint
from sqsq.core import commands as c
from sqsq.core import keys
from sqsq.core.entry import Entry, encode_entry
from sqsq.core.state import ShardConfig
from sqsq.shard import applier, readyloop, writesets
from sqsq.shard.engine import ShardEngine
from sqsq.shard.host import ReplicaOptions
from sqsq.shard.service import ShardService
from sqsq.shard.statemachine import ShardMachine

CONFIG = ShardConfig(5, b"k" * 32)


def dump(engine: ShardEngine) -> list[tuple[bytes, bytes]]:
    return list(engine.machine.store.scan(b"", b"\xff" * 8))


async def traffic(api: ShardService) -> None:
    """Every kind of write a queue sees: sends (standard, FIFO, delayed), receives, deletes,
    visibility changes, attributes."""
    await api.create_queue("jobs", {"VisibilityTimeout": "30"})
    await api.create_queue("jobs.fifo", {"FifoQueue": "true",
                                         "ContentBasedDeduplication": "true"})
    for round_ in range(6):
        sends = [api.send_message_batch("jobs", [c.SendEntry(str(i), f"r{round_}m{i}")
                                                 for i in range(10)]),
                 api.send_message_batch("jobs", [c.SendEntry("d", "later", delay_seconds=60)]),
                 api.send_message_batch("jobs.fifo", [
                     c.SendEntry(str(i), f"f{round_}-{i}", message_group_id=f"g{i % 3}")
                     for i in range(5)])]
        await asyncio.gather(*sends)
        got = await api.receive_message("jobs", max_number_of_messages=10)
        fifo = await api.receive_message("jobs.fifo", max_number_of_messages=10)
        await asyncio.gather(
            api.delete_message_batch("jobs", [(str(i), m.receipt_handle)
                                              for i, m in enumerate(got[:6])]),
            api.change_message_visibility_batch("jobs", [(str(i), m.receipt_handle, 0)
                                                         for i, m in enumerate(got[6:])]),
            api.delete_message_batch("jobs.fifo", [(str(i), m.receipt_handle)
                                                   for i, m in enumerate(fifo)]))
    await api.set_queue_attributes("jobs", {"MessageRetentionPeriod": "3600"})


@pytest.mark.parametrize("memory", [True, False], ids=["memory", "rocksdb"])
def test_followers_write_the_leaders_write_sets_and_end_identical(
        tmp_path: Path, memory: bool) -> None:
    async def scenario(group: Group) -> None:
        lead = await group.settled_leader()
        await traffic(ShardService(lead, Endpoint()))
        lead = await group.settled_leader()
        followers = [e for e in group.engines if e is not lead]
        for engine in followers:
            # most entries were written from the leader's write set, not applied again
            counts = engine.replica.write_sets
            assert counts.used > 20
            assert counts.used > 2 * counts.applied_self
        for engine in followers:
            assert dump(engine) == dump(lead)

    run(scenario, tmp_path, ReplicaOptions(bootstrap=True, memory=memory))


async def queue_made(group: Group) -> tuple[ShardEngine, ShardService]:
    """The leader, and its service, once queue ``jobs`` is made and every replica applied
    it."""
    api = ShardService(await group.settled_leader(), Endpoint())
    await api.create_queue("jobs", {})
    lead = await group.settled_leader()
    return lead, ShardService(lead, Endpoint())


def hold_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower's apply waits an hour for company. Its writes stay on the event loop: on
    a slow disk's path (a worker thread writes), what is durable is applied at once."""
    monkeypatch.setattr(applier, "FOLLOWER_APPLY_LINGER_S", 3600.0)
    monkeypatch.setattr(applier, "FOLLOWER_APPLY_LATEST_S", 3600.0)
    monkeypatch.setattr(readyloop, "INLINE_WRITE_S", 3600.0)


async def sent_one_by_one(api: ShardService, lead: ShardEngine, waiting: list[ShardEngine],
                          count: int) -> int:
    """``count`` sends, each its own entry, with the followers' applies held back (their
    wait made an hour, ``hold_back``): the last entry's index, once ``waiting`` know it is
    committed and hold every write set, none of it applied."""
    applied = [e.machine.applied_index for e in waiting]
    for i in range(count):
        await api.send_message_batch("jobs", [c.SendEntry("0", f"m{i}")])
    last = lead.replica.raftCommitIndex
    assert last >= applied[0] + count
    await until(lambda: all(e.replica.raftCommitIndex >= last and
                            e.replica.write_sets.has(last) for e in waiting))
    assert [e.machine.applied_index for e in waiting] == applied  # it waits
    return last


def test_a_follower_writes_the_write_sets_that_waited_in_one_store_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store write costs a replica tens of microseconds however little it holds: the
    entries a follower applies together are written together, and leave the same store."""
    async def scenario(group: Group) -> None:
        lead, api = await queue_made(group)
        follower = next(e for e in group.engines if e is not lead)
        hold_back(monkeypatch)
        store, writes = follower.machine.store, []
        write = store.write

        def counting(w: dict[bytes, bytes | None], *, sync: bool) -> None:
            writes.append(len(w))
            write(w, sync=sync)
        store.write = counting  # type: ignore[method-assign]
        last = await sent_one_by_one(api, lead, [follower], 8)
        used = follower.replica.write_sets.used
        await follower.replica._applied_all()  # as a snapshot does before it is taken
        assert follower.machine.applied_index == last
        assert follower.replica.write_sets.used >= used + 8
        assert len(writes) == 1
        assert dump(follower) == dump(lead)

    run(scenario, tmp_path, ReplicaOptions(bootstrap=True, memory=False))


def test_a_follower_applies_what_waits_though_no_commit_comes_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(group: Group) -> None:
        lead, api = await queue_made(group)
        monkeypatch.setattr(applier, "FOLLOWER_APPLY_LINGER_S", 3600.0)  # the timer's alone
        monkeypatch.setattr(readyloop, "INLINE_WRITE_S", 3600.0)  # (see ``hold_back``)
        for i in range(3):
            await api.send_message_batch("jobs", [c.SendEntry("0", f"m{i}")])
        last = lead.replica.raftCommitIndex
        await until(lambda: all(e.machine.applied_index == last for e in group.engines))
        assert all(dump(e) == dump(lead) for e in group.engines)

    run(scenario, tmp_path)


def test_a_follower_that_comes_to_lead_applies_what_waited_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its callers wait for its apply, where nobody waited for a follower's."""
    async def scenario(group: Group) -> None:
        lead, api = await queue_made(group)
        others = [e for e in group.engines if e is not lead]
        hold_back(monkeypatch)
        await sent_one_by_one(api, lead, others, 5)
        group.cut.add(lead.replica.id)
        await until(lambda: group.leader(others) is not None)
        new = ShardService(group.leader(others), Endpoint())  # type: ignore[arg-type]
        bodies: set[str] = set()
        async with asyncio.timeout(10):
            while len(bodies) < 5:
                got = await new.receive_message("jobs", max_number_of_messages=10)
                bodies |= {m.body for m in got}
        assert bodies == {f"m{i}" for i in range(5)}

    run(scenario, tmp_path)


def machine(path: Path) -> ShardMachine:
    return ShardMachine(path, CONFIG, memory=True)


def entries() -> list[bytes]:
    return [encode_entry(Entry(1000, (c.CreateQueue("orders"),))),
            encode_entry(Entry(2000, (c.SendMessages("orders", (
                c.SendEntry("0", "hello"), c.SendEntry("1", "world"))),)))]


def test_a_write_set_leaves_the_store_applying_the_entry_would(tmp_path: Path) -> None:
    leader, follower, alone = (machine(tmp_path / n) for n in ("l", "f", "a"))
    for index, data in enumerate(entries(), start=1):
        applied = leader.apply_entry_writes(index, data)
        assert applied is not None
        follower.apply_writes(index, writesets.unpack(writesets.pack(applied[1]), index))
        alone.apply_entry(index, data)
    everything = (b"", b"\xff" * 8)
    assert list(follower.store.scan(*everything)) == list(alone.store.scan(*everything))
    assert (follower.applied_index, follower.last_now_ms) == (2, 2000)


def test_a_write_set_of_another_entry_is_refused(tmp_path: Path) -> None:
    leader = machine(tmp_path)
    leader.apply_entry_writes(1, entries()[0])
    applied = leader.apply_entry_writes(2, entries()[1])
    assert applied is not None
    blob = writesets.pack(applied[1])
    assert blob is not None
    with pytest.raises(ValueError, match="not the one of entry 3"):
        writesets.unpack(blob, 3)
    with pytest.raises(ValueError, match="not msgpack"):
        writesets.unpack(blob[:-3], 2)
    with pytest.raises(ValueError, match="not a map"):
        writesets.unpack(writesets._PACKER.pack([1, 2]), 2)
    without_meta = {k: v for k, v in applied[1].items() if k != keys.META_KEY}
    with pytest.raises(ValueError, match="not the one of entry 2"):
        writesets.unpack(writesets._PACKER.pack(without_meta), 2)
    for key, value in (("text", b"v"), (b"k", "text"), (b"k", 1), (b"k", [b"v"]),
                       (1, b"v"), (b"k", True)):
        tampered = {**applied[1], key: value}
        with pytest.raises(ValueError, match="not a byte string"):
            writesets.unpack(writesets._PACKER.pack(tampered), 2)
    for meta in (writesets._PACKER.pack(5), b"\xc1", writesets._PACKER.pack([1] * 9)):
        tampered = {**applied[1], keys.META_KEY: meta}  # a Meta that does not decode
        with pytest.raises(ValueError, match="not the one of entry 2"):
            writesets.unpack(writesets._PACKER.pack(tampered), 2)


def test_a_write_set_is_used_only_for_the_entry_it_names() -> None:
    received = writesets.Received()
    mine, other = writesets.check(b"entry"), writesets.check(b"another shard's entry")
    received.add(7, 3, mine, b"set", applied=5)
    assert received.take(7, 4, mine) is None  # the entry at 7 is another term's: apply it
    received.add(7, 3, other, b"set", applied=5)
    assert received.take(7, 3, mine) is None  # same index and term, other bytes: apply it
    received.add(7, 3, mine, b"set", applied=5)
    assert received.take(7, 3, mine) == b"set"
    assert received.take(7, 3, mine) is None  # taken once
    received.add(5, 3, mine, b"old", applied=5)  # already applied: not kept
    assert received.take(5, 3, mine) is None and received.dropped == 1


def test_a_follower_keeps_what_it_has_not_applied_within_bounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writesets, "MAX_KEPT", 3)
    received = writesets.Received()
    for index in range(10, 15):
        received.add(index, 1, 0, b"x", applied=0)
    assert received.dropped == 2
    received.forget_to(11)
    assert [received.take(i, 1, 0) for i in (10, 11, 12)] == [None, None, b"x"]


def test_a_follower_waits_for_an_expected_write_set_only_so_long() -> None:
    async def scenario() -> None:
        received = writesets.Received()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await received.wait(4, timeout_s=0.05)  # nothing comes: the wait ends on its own
        assert loop.time() - started >= 0.05
        waiting = asyncio.create_task(received.wait(4, timeout_s=30))
        await asyncio.sleep(0)
        received.add(4, 1, 0, b"x", applied=0)
        await asyncio.wait_for(waiting, 5)  # it came: the wait ends at once

    asyncio.run(scenario())
