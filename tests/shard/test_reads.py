"""Reads by ReadIndex, over a three-replica group in one event loop (``shardgroup``): reads and
empty receives take no log entry, and a leader cut off from its followers never answers
from a stale view."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shardgroup import Group, run, until
from sqsq.api import Endpoint
from sqsq.core import commands as c
from sqsq.errors import NotLeader, ServiceUnavailable
from sqsq.shard.service import ShardService


def test_reads_and_empty_receives_add_nothing_to_the_log(tmp_path: Path) -> None:
    async def scenario(group: Group) -> None:
        lead = await group.settled_leader()
        api = ShardService(lead, Endpoint())
        await api.create_queue("orders")
        await api.send_message_batch("orders", [c.SendEntry("0", "hello")])
        [m] = await api.receive_message("orders", visibility_timeout=600)
        assert m.body == "hello"
        lead = await group.settled_leader()
        indexes = [(e.replica.raftCommitIndex, e.applied_index) for e in group.engines]
        for _ in range(20):
            attrs = await api.get_queue_attributes("orders", ["All"])
            assert attrs["ApproximateNumberOfMessagesNotVisible"] == "1"
            assert len((await api.list_queues())[0]) == 1
            await api.get_queue_url("orders")
            assert await api.receive_message("orders") == []  # the one message is in flight
            assert (await api.peek_messages("orders", 10)) is not None
        assert await api.receive_message("orders", wait_time_seconds=1) == []  # a long poll
        assert [(e.replica.raftCommitIndex, e.applied_index)
                for e in group.engines] == indexes

    run(scenario, tmp_path)


def test_a_long_poll_wakes_on_a_send_and_the_receive_goes_through_the_log(
        tmp_path: Path) -> None:
    async def scenario(group: Group) -> None:
        lead = await group.settled_leader()
        api = ShardService(lead, Endpoint())
        await api.create_queue("orders")
        poll = asyncio.create_task(api.receive_message("orders", wait_time_seconds=20))
        await until(lambda: lead.waiters.parked > 0)
        before = lead.replica.raftCommitIndex
        await api.send_message_batch("orders", [c.SendEntry("0", "wake up")])
        assert [m.body for m in await poll] == ["wake up"]
        assert lead.replica.raftCommitIndex >= before + 2  # the send, then the receive
        assert await api.receive_message("orders") == []  # in flight: not again

    run(scenario, tmp_path)


@pytest.mark.parametrize("read", ["attributes", "receive"])
def test_a_leader_cut_off_never_answers_from_a_stale_view(tmp_path: Path, read: str) -> None:
    """The leader is cut off from its followers and its clock stands still (a stalled
    process: it still believes it leads). The other two elect a leader, which acknowledges
    a send. A read at the old leader must not answer from its old state: not a count without
    that message, not an empty receive. It waits for a quorum that never answers; once the
    cut heals it learns of the new term and answers NotLeader."""

    async def scenario(group: Group) -> None:
        old = await group.settled_leader()
        await ShardService(old, Endpoint()).create_queue("orders")
        await group.settled_leader()
        group.cut.add(old.replica.id)
        old.replica.tick = lambda: None  # type: ignore[method-assign]
        rest = [e for e in group.engines if e is not old]
        await until(lambda: group.leader(rest) is not None)
        new = group.leader(rest)
        assert new is not None and old.replica.is_leader()
        sent = await ShardService(new, Endpoint()).send_message_batch(
            "orders", [c.SendEntry("0", "acknowledged")])
        assert sent.successful

        stale = ShardService(old, Endpoint())
        if read == "attributes":
            asked = asyncio.create_task(
                stale.get_queue_attributes("orders", ["ApproximateNumberOfMessages"]))
        else:
            asked = asyncio.create_task(stale.receive_message("orders"))
        # Once its ReadIndex is out, the read waits for a quorum the cut keeps from answering.
        await until(lambda: asked.done() or bool(old.replica.core.pending_reads))  # type: ignore[union-attr]
        assert not asked.done(), f"answered from a stale view: {asked.result()}"
        group.cut.clear()
        with pytest.raises((NotLeader, ServiceUnavailable)):
            await asked

    run(scenario, tmp_path)


def test_a_new_leader_reads_every_write_its_predecessor_acknowledged(tmp_path: Path) -> None:
    """Just after a hand-over the new leader may not have applied (or know committed) the
    last writes: its read waits for its own term's first commit and that apply."""

    async def scenario(group: Group) -> None:
        old = await group.settled_leader()
        api = ShardService(old, Endpoint())
        await api.create_queue("orders")
        for n in range(5):
            await api.send_message_batch("orders", [c.SendEntry("0", f"m{n}")])
        successor = await old.hand_over()
        new = next(e for e in group.engines if e.replica.id == successor)
        await until(new.replica.is_leader)
        attrs = await ShardService(new, Endpoint()).get_queue_attributes(
            "orders", ["ApproximateNumberOfMessages"])
        assert attrs == {"ApproximateNumberOfMessages": "5"}

    run(scenario, tmp_path)
