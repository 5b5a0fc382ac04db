"""Reads by ReadIndex, over a three-replica group in one event loop (each replica with its own
peer network on 127.0.0.1, as three node processes have): reads and empty receives take no
log entry, and a leader cut off from its followers never answers from a stale view."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from serverproc import free_port
from sqsq.api import Endpoint
from sqsq.core import commands as c
from sqsq.core.machine import sweep_needed
from sqsq.core.state import ShardConfig
from sqsq.errors import NotLeader, ServiceUnavailable
from sqsq.raft import Message
from sqsq.shard.engine import ShardEngine
from sqsq.shard.host import Peer, PeerNetwork, ReplicaOptions, open_replica
from sqsq.shard.service import ShardService

SHARD = 0
SECRET = b"s" * 32
TIMEOUT_S = 30.0


class Group:
    """Three replicas of one shard; links to one of them can be cut (every Raft message from
    or to it dropped, its node reported silent) and healed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.peers = [Peer("127.0.0.1", free_port(), free_port()) for _ in range(3)]
        self.cut: set[str] = set()  # Raft addresses of replicas cut off from the rest
        self.networks: list[PeerNetwork] = []
        self.engines: list[ShardEngine] = []

    async def start(self) -> None:
        for i, me in enumerate(self.peers):
            network = PeerNetwork(me, "127.0.0.1", SECRET, self.root / f"n{i}")
            await network.start()
            engine = open_replica(SHARD, self.root / f"n{i}" / "shard", ShardConfig(SHARD, SECRET),
                                  me, self.peers, ReplicaOptions(bootstrap=True, memory=True),
                                  network)
            self._cuttable(engine)
            self.networks.append(network)
            self.engines.append(engine)
        for engine in self.engines:
            await engine.start()

    def _cuttable(self, engine: ShardEngine) -> None:
        replica = engine.replica
        step, heard = replica.step, replica.heard

        def filtered(m: Message) -> None:
            if m.frm not in self.cut and m.to not in self.cut:
                step(m)

        def heard_unless_cut(node: str) -> float | None:
            # the node's own heartbeat does not cross the cut either
            if node in {f"{p.host}:{p.raft_port}" for p in self.peers if p.raft(SHARD) in self.cut}:
                return None
            return heard(node) if heard is not None else None

        replica.step = filtered  # type: ignore[method-assign]
        replica.heard = heard_unless_cut

    async def stop(self) -> None:
        for engine in self.engines:
            await engine.stop()
        for network in self.networks:
            await network.stop()

    def leader(self, among: list[ShardEngine] | None = None) -> ShardEngine | None:
        leaders = [e for e in among or self.engines if e.replica.is_leader()]
        return leaders[0] if len(leaders) == 1 else None

    async def settled_leader(self, among: list[ShardEngine] | None = None) -> ShardEngine:
        """The leader once it has recorded the configuration, has nothing to sweep, and
        every replica of ``among`` has applied everything it committed."""
        among = among or self.engines

        def settled() -> bool:
            lead = self.leader(among)
            return lead is not None and lead.machine.recorded_fingerprint() is not None \
                and not lead.query(sweep_needed) and all(
                    e.replica.raftLastApplied == lead.replica.raftCommitIndex for e in among)

        await until(settled)
        lead = self.leader(among)
        assert lead is not None
        return lead


async def until(done: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not done():
            await asyncio.sleep(0.01)


def run(scenario: Callable[[Group], object], root: Path) -> None:
    async def main() -> None:
        group = Group(root)
        await group.start()
        try:
            await scenario(group)  # type: ignore[misc]
        finally:
            await group.stop()

    asyncio.run(asyncio.wait_for(main(), 120))


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
