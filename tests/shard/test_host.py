"""The node's one Raft clock (``PeerNetwork``): its heartbeat to the nodes it shares a group
with keeps up with the groups' memberships, so a quiet group stays quiet on a node that
joined it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from serverproc import free_port
from shard.test_replica import SHARD, QuietNode, commit, leader, until
from sqsq.core import commands as c
from sqsq.shard.host import TICK_S
from sqsq.shard.replica import HostSettings


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
