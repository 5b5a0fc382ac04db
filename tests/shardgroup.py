"""A three-replica shard group of engines in one event loop, each replica with its own peer
network on 127.0.0.1 as three node processes have; links to one replica can be cut."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from serverproc import free_port
from sqsq.core.machine import sweep_needed
from sqsq.core.state import ShardConfig
from sqsq.raft import Message
from sqsq.shard.engine import ShardEngine
from sqsq.shard.host import Peer, PeerNetwork, ReplicaOptions, open_replica

SHARD = 0
SECRET = b"s" * 32
TIMEOUT_S = 30.0


class Group:
    """Three replicas of one shard; links to one of them can be cut (every Raft message from
    or to it dropped, its node reported silent) and healed."""

    def __init__(self, root: Path, options: ReplicaOptions | None = None) -> None:
        self.root = root
        self.options = options or ReplicaOptions(bootstrap=True, memory=True)
        self.peers = [Peer("127.0.0.1", free_port(), free_port()) for _ in range(3)]
        self.cut: set[str] = set()  # Raft addresses of replicas cut off from the rest
        self.networks: list[PeerNetwork] = []
        self.engines: list[ShardEngine] = []

    async def start(self) -> None:
        for i, me in enumerate(self.peers):
            network = PeerNetwork(me, "127.0.0.1", SECRET, self.root / f"n{i}")
            await network.start()
            engine = open_replica(SHARD, self.root / f"n{i}" / "shard", ShardConfig(SHARD, SECRET),
                                  me, self.peers, self.options,
                                  network)
            self._cuttable(engine)
            self.networks.append(network)
            self.engines.append(engine)
        for engine in self.engines:
            await engine.start()

    def _cuttable(self, engine: ShardEngine) -> None:
        replica = engine.replica
        step, heard = replica.step, replica.heard

        def filtered(m: Message, settle: bool = True) -> None:
            if m.frm not in self.cut and m.to not in self.cut:
                step(m, settle)

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


def run(scenario: Callable[[Group], object], root: Path,
        options: ReplicaOptions | None = None) -> None:
    async def main() -> None:
        group = Group(root, options)
        await group.start()
        try:
            await scenario(group)  # type: ignore[misc]
        finally:
            await group.stop()

    asyncio.run(asyncio.wait_for(main(), 120))
