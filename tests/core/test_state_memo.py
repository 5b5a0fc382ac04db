"""A command hands the meta and counters it wrote to the next command of its transaction
(``Txn.memo``); one that fails half-way must hand on nothing it changed."""

from __future__ import annotations

from coresupport import CONFIG
from sqsq.core import commands as c
from sqsq.core import keys
from sqsq.core import records as r
from sqsq.core.machine import apply
from sqsq.core.state import ShardState
from sqsq.core.txn import Txn
from sqsq.shard.store import MemoryStore


def _queue(txn: Txn) -> r.QueueRecord:
    apply(txn, CONFIG, c.CreateQueue("q", ()), 1_000)
    apply(txn, CONFIG, c.SendMessages("q", (c.SendEntry("1", "hello"),), "", ("m-1",)), 1_001)
    q = ShardState(txn, CONFIG).queue("q")
    assert q is not None
    return q


def test_a_command_that_stops_before_its_flush_hands_on_nothing_it_changed() -> None:
    txn = Txn(MemoryStore())
    q = _queue(txn)
    held = (r.Meta.decode(txn.get(keys.META_KEY)),
            r.Counters.decode(txn.get(keys.counters_key(q.qid))))
    st = ShardState(txn, CONFIG)  # a command that raises after changing both, unflushed
    st.next_seq()
    st.counters(q.qid).visible += 5
    after = ShardState(txn, CONFIG)
    assert (after.meta, after.counters(q.qid)) == held


def test_a_rolled_back_command_hands_on_nothing_it_wrote() -> None:
    txn = Txn(MemoryStore())
    q = _queue(txn)
    held = (r.Meta.decode(txn.get(keys.META_KEY)),
            r.Counters.decode(txn.get(keys.counters_key(q.qid))))
    savepoint = txn.savepoint()
    st = ShardState(txn, CONFIG)
    st.next_seq()
    st.counters(q.qid).visible += 5
    st.flush()
    txn.rollback(savepoint)
    after = ShardState(txn, CONFIG)
    assert (after.meta, after.counters(q.qid)) == held


def test_the_next_command_reads_what_the_last_one_wrote() -> None:
    txn = Txn(MemoryStore())
    q = _queue(txn)
    apply(txn, CONFIG, c.SendMessages("q", (c.SendEntry("2", "again"),), "", ("m-2",)), 1_002)
    st = ShardState(txn, CONFIG)
    assert st.meta == r.Meta.decode(txn.get(keys.META_KEY))
    assert st.counters(q.qid) == r.Counters.decode(txn.get(keys.counters_key(q.qid)))
    assert st.counters(q.qid).visible == 2
