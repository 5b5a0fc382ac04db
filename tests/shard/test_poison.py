"""A command whose apply raises (a bug some input reaches) must not take its shard down: every
replica answers it InternalError, keeps none of its writes and runs on. Only a failure that may
differ between replicas (the store failing under a read) stops the replica, naming the entry."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shardgroup import Group, run
from sqsq.api import Endpoint
from sqsq.core import commands as c
from sqsq.core import machine
from sqsq.core.entry import Entry, encode_entry
from sqsq.core.state import ShardConfig
from sqsq.errors import ErrorCode, Rejection
from sqsq.shard.host import ReplicaOptions
from sqsq.shard.service import ShardService
from sqsq.shard.statemachine import PoisonEntry, ShardMachine

TRACE = b"\x00poison-was-here"  # a key the poisoned command writes before it raises


@pytest.fixture
def poison_tags(monkeypatch: pytest.MonkeyPatch) -> None:
    """TagQueue raises, after a write, when a tag named ``poison`` is set."""
    real = machine.HANDLERS[c.TagQueue]

    def tag(st: machine.ShardState, cmd: c.TagQueue, now: int) -> c.Outcome:
        if dict(cmd.tags).get("poison"):
            st.txn.put(TRACE, b"1")
            raise KeyError("a bug this input reaches")
        return real(st, cmd, now)

    monkeypatch.setitem(machine.HANDLERS, c.TagQueue, tag)


def test_a_command_whose_apply_raises_is_answered_internal_error_on_every_replica(
        tmp_path: Path, poison_tags: None, caplog: pytest.LogCaptureFixture) -> None:
    stopped: list[BaseException] = []

    async def scenario(group: Group) -> None:
        import asyncio

        lead = await group.settled_leader()
        api = ShardService(lead, Endpoint())
        await api.create_queue("orders")
        # one turn of the event loop: both commands share an entry
        poisoned, fine = await asyncio.gather(
            lead.execute(c.TagQueue("orders", (("poison", "yes"),))),
            lead.execute(c.TagQueue("orders", (("team", "a"),))))
        assert isinstance(poisoned, Rejection)
        assert poisoned.code is ErrorCode.INTERNAL_ERROR
        assert isinstance(fine, c.Ok)
        await api.send_message_batch("orders", [c.SendEntry("0", "after")])
        assert [m.body for m in await api.receive_message("orders")] == ["after"]
        lead = await group.settled_leader()
        assert (await api.list_queue_tags("orders")) == {"team": "a"}
        for engine in group.engines:
            assert engine.replica.fatal is None
            assert engine.applied_index == lead.applied_index
            assert engine.machine.store.get(TRACE) is None  # rolled back everywhere

    run(scenario, tmp_path, ReplicaOptions(bootstrap=True, memory=True,
                                           on_fatal=stopped.append))
    assert stopped == []
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("TagQueue on queue 'orders' raised KeyError" in line for line in lines)


def test_an_entry_whose_commands_raise_still_applies_the_rest_in_order(
        tmp_path: Path, poison_tags: None) -> None:
    m = ShardMachine(tmp_path, ShardConfig(3, b"k" * 32), memory=True)
    m.apply_entry(1, encode_entry(Entry(1000, (c.CreateQueue("orders"),))))
    outcomes = m.apply_entry(2, encode_entry(Entry(2000, (
        c.TagQueue("orders", (("a", "1"),)),
        c.TagQueue("orders", (("poison", "yes"),)),
        c.TagQueue("orders", (("b", "2"),))))))
    assert outcomes is not None
    assert [type(o.result) for o in outcomes] == [c.Ok, Rejection, c.Ok]
    assert m.applied_index == 2 and m.store.get(TRACE) is None
    m.close()


@pytest.mark.parametrize("memory", [True, False], ids=["memory", "rocksdb"])
def test_a_store_failure_under_apply_stops_the_replica_naming_shard_index_and_command(
        tmp_path: Path, memory: bool) -> None:
    """A read the store fails may succeed on another replica: answering it InternalError here
    would let this replica's state differ from theirs, so it stops instead. RocksDB's reads
    raise from C, with no frame of the store module in the traceback."""
    m = ShardMachine(tmp_path, ShardConfig(3, b"k" * 32), memory=memory)
    m.apply_entry(1, encode_entry(Entry(1000, (c.CreateQueue("orders"),))))
    m.store.inner.close()  # its reads raise now
    data = encode_entry(Entry(2000, (c.TagQueue("orders", (("a", "b"),)),)))
    with pytest.raises(PoisonEntry, match=r"shard 3: log entry 7 \(TagQueue on queue "
                                          r"'orders'\) failed to apply"):
        m.apply_entry(7, data)
    assert m.applied_index == 1
