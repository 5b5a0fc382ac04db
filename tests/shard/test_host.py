"""The node's one Raft clock (``PeerNetwork``): its heartbeat to the nodes it shares a group
with keeps up with the groups' memberships, so a quiet group stays quiet on a node that
joined it; it slows down while every group on the node is quiet."""

from __future__ import annotations

import asyncio
from pathlib import Path

from serverproc import free_port
from shard.test_replica import SHARD, QuietNode, commit, group, leader, until
from sqsq.core import commands as c
from sqsq.core.entry import Entry, encode_entry
from sqsq.shard.host import QUIET_TICK_S, TICK_S, Peer, PeerNetwork
from sqsq.shard.replica import HostSettings, Proposal


class QuietJoiner(QuietNode):
    bootstrap = False


def test_a_member_added_to_a_quiet_group_is_pinged_and_the_group_stays_quiet(
        tmp_path: Path) -> None:
    # The leader's node works out whom to ping once per second at least, and again when Raft
    # messages arrive; had it kept the nodes of the first membership, the new member's node
    # would hear nothing from the leader's once the group went quiet, wake its replica
    # (the leader's lease run out) and call an election.
    settings = HostSettings(tick_s=TICK_S, quiesce_after_ticks=10, liveness_s=0.5)

    async def scenario() -> None:
        ports = [free_port() for _ in range(3)]
        members = [f"127.0.0.1:{p + SHARD}" for p in ports]
        nodes = [QuietNode(tmp_path / f"n{i}", p, members[:2], settings)
                 for i, p in enumerate(ports[:2])]
        new = QuietJoiner(tmp_path / "n2", ports[2], members[:2], settings)
        for n in nodes:
            await n.start()
        await new.start()
        everyone = [*nodes, new]
        try:
            await commit(nodes, c.CreateQueue("q"))
            first = leader(nodes)
            assert first is not None
            done: asyncio.Future = asyncio.get_running_loop().create_future()
            first.replica.change_member(new.member, None,
                                        lambda ok: done.done() or done.set_result(ok))
            assert await done is True
            await until(lambda: all(n.replica.core is not None and n.replica.core.quiesced
                                    for n in everyone))
            sent = sum(n.transport.messages_sent for n in everyone)
            await asyncio.sleep(40 * TICK_S)  # twice the liveness bound, past a recount
            assert sum(n.transport.messages_sent for n in everyone) == sent
            assert all(n.replica.core.quiesced for n in everyone)  # type: ignore[union-attr]
        finally:
            for n in everyone:
                if not n.replica._stopped:
                    await n.stop()

    asyncio.run(scenario())


def test_a_node_whose_groups_are_all_quiet_ticks_slower_until_one_has_work(
        tmp_path: Path) -> None:
    # A quiet replica is not ticked, so a node hosting only quiet ones slows its clock to the
    # heartbeat's pace. A proposal wakes the group: each member's node must be back at Raft's
    # pace as soon as its replica has work (by the time the entry commits), not at its next
    # slow tick, or a woken group's heartbeats and elections would run four times slower.
    settings = HostSettings(tick_s=TICK_S, quiesce_after_ticks=10, liveness_s=0.5)

    async def scenario() -> None:
        nodes = await group(tmp_path, settings, QuietNode)
        try:
            await commit(nodes, c.CreateQueue("q"))
            await until(lambda: all(n.network.tick_s == QUIET_TICK_S for n in nodes))
            assert all(n.replica.core.quiesced for n in nodes)  # type: ignore[union-attr]
            first = leader(nodes)
            assert first is not None
            entry = first.replica.core.log.last_index() + 1  # type: ignore[union-attr]
            paces: asyncio.Future = asyncio.get_running_loop().create_future()
            first.replica.propose(
                encode_entry(Entry(1_000, (c.CreateQueue("r"),))),
                lambda status, out: paces.done() or paces.set_result(
                    (status, [(n.network.tick_s, n.replica.core.log.stable)  # type: ignore
                              for n in nodes])))
            status, at_commit = await paces
            assert status is Proposal.COMMITTED
            # Every node whose replica has written the entry (a majority at least; the
            # leader's Ready loop sent it) had its clock back at Raft's pace.
            holding = [pace for n, (pace, stable) in zip(nodes, at_commit, strict=True)
                       if n is first or stable >= entry]
            assert len(holding) >= 2
            assert holding == [TICK_S] * len(holding)
            await until(lambda: all(n.network.tick_s == QUIET_TICK_S for n in nodes))
        finally:
            for n in nodes:
                await n.stop()

    asyncio.run(scenario())


def test_the_clocks_heartbeat_round_wakes_what_waits_for_it(tmp_path: Path) -> None:
    # A node's leader-hint passes wait for this beat instead of a timer of their own.
    async def scenario() -> None:
        network = PeerNetwork(Peer("127.0.0.1", 0, free_port()), "127.0.0.1", b"s" * 32,
                              tmp_path)
        await network.start()
        try:
            gone = asyncio.ensure_future(network.beat())
            waiting = asyncio.ensure_future(network.beat())
            await asyncio.sleep(0)
            gone.cancel()
            assert not waiting.done()  # not before the clock's round
            await asyncio.wait_for(waiting, 10 * QUIET_TICK_S)
            for _ in range(3):  # and again at every round
                await asyncio.wait_for(network.beat(), 10 * QUIET_TICK_S)
        finally:
            await network.stop()

    asyncio.run(scenario())
