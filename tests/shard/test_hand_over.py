"""Leadership handed over before a graceful stop and to spread the leaders, over a
three-replica group in one event loop (``shardgroup``)."""

from __future__ import annotations

import time
from pathlib import Path

from shardgroup import Group, run, until
from sqsq.api import Endpoint
from sqsq.core import commands as c
from sqsq.shard.raftclock import node_of
from sqsq.shard.service import ShardService


def test_a_hand_over_passes_over_a_follower_that_stopped_answering(tmp_path: Path) -> None:
    """A follower whose node stopped just before this one still holds the whole log; asked to
    take over it never does. The leader moves on to the other, rather than stop without a
    successor (an election timeout without a leader for the shard)."""

    async def scenario(group: Group) -> None:
        lead = await group.settled_leader()
        await ShardService(lead, Endpoint()).create_queue("orders")
        lead = await group.settled_leader()
        gone, live = sorted(e.replica.id for e in group.engines if e is not lead)
        group.cut.add(gone)  # the first in address order: the one ``pick=0`` names
        assert await lead.hand_over(pick=0, timeout_s=2.0) == live

    run(scenario, tmp_path)


def test_a_hand_over_to_a_named_follower_goes_to_it(tmp_path: Path) -> None:
    async def scenario(group: Group) -> None:
        lead = await group.settled_leader()
        _, second = sorted(e.replica.id for e in group.engines if e is not lead)
        assert await lead.hand_over(pick=0, to=second) == second

    run(scenario, tmp_path)


def test_with_every_other_node_gone_a_hand_over_gives_up_at_once(tmp_path: Path) -> None:
    """The last node of a cluster stopping: its followers' nodes are gone (their connections
    closed), nobody can take over, and its stop does not wait out the hand-over timeout."""

    async def scenario(group: Group) -> None:
        lead = await group.settled_leader()
        transport = lead.replica.transport
        assert transport is not None
        gone = [(e, n) for e, n in zip(group.engines, group.networks, strict=True)
                if e is not lead]
        for engine, network in gone:
            await engine.stop()
            await network.stop()
            group.engines.remove(engine)
            group.networks.remove(network)
        nodes = [node_of(e.replica.id, 0)[0] for e, _ in gone]
        await until(lambda: not any(transport.linked(n) for n in nodes))
        asked = time.monotonic()
        assert await lead.hand_over(timeout_s=20.0) is None
        assert time.monotonic() - asked < 10.0  # not the 20 s timeout

    run(scenario, tmp_path)


def test_a_hand_over_to_a_named_follower_far_behind_is_not_started(tmp_path: Path) -> None:
    """The leader balancer names a node that has just restarted: requests would be held while
    it catches up, so the hand-over is not started (the balancer asks again later)."""

    async def scenario(group: Group) -> None:
        lead = await group.settled_leader()
        api = ShardService(lead, Endpoint())
        await api.create_queue("orders")
        behind, _ = sorted(e.replica.id for e in group.engines if e is not lead)
        group.cut.add(behind)
        for n in range(80):  # past the slack
            await api.send_message_batch("orders", [c.SendEntry("0", f"m{n}")])
        asked = time.monotonic()
        assert await lead.hand_over(to=behind, timeout_s=20.0) is None
        assert time.monotonic() - asked < 10.0  # not held for the 20 s timeout
        assert lead.replica.is_leader()
        assert (await api.send_message_batch("orders", [c.SendEntry("0", "after")])).successful

    run(scenario, tmp_path)
