"""Three shard replicas on sqsq's own Raft in one event loop, as the replica tests start
them: each node with its peer transport on 127.0.0.1, Raft storage and RocksDB state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from serverproc import free_port
from sqsq.core import commands as c
from sqsq.core.entry import Entry, encode_entry
from sqsq.core.state import ShardConfig
from sqsq.shard.peers import PeerTransport
from sqsq.shard.replica import HostSettings, Proposal, RaftReplica, Replicas
from sqsq.shard.statemachine import ShardMachine

SHARD = 1
SECRET = b"s" * 32
CONFIG = ShardConfig(shard_id=SHARD, secret=SECRET)
TIMEOUT_S = 20.0


class Node:
    bootstrap = True  # a first member of the group

    def __init__(self, root: Path, port: int, members: list[str],
                 settings: HostSettings) -> None:
        self.root, self.port, self.members, self.settings = root, port, members, settings
        self.member = f"127.0.0.1:{port + SHARD}"

    async def start(self) -> None:
        self.replicas = Replicas()
        self.transport = PeerTransport(
            f"127.0.0.1:{self.port}", "127.0.0.1", self.port, SECRET,
            self.replicas.on_messages, self.replicas.on_snapshot,
            snapshot_dir=self.root / "incoming", on_refused=self.replicas.on_refused)
        await self.transport.start()
        self.machine = ShardMachine(self.root / "shard", CONFIG)
        self.replica = RaftReplica(SHARD, self.member, self.root / "shard", self.machine,
                                   self.transport, voters=self.members,
                                   bootstrap=self.bootstrap, settings=self.settings)
        self.replicas.by_shard[SHARD] = self.replica
        await self.replica.start()

    async def stop(self) -> None:
        await self.replica.stop()
        await self.transport.stop()
        self.machine.close()


async def until(done: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not done():
            await asyncio.sleep(0.01)


async def group(tmp_path: Path, settings: HostSettings) -> list[Node]:
    ports = [free_port() for _ in range(3)]
    members = [f"127.0.0.1:{p + SHARD}" for p in ports]
    nodes = [Node(tmp_path / f"n{i}", p, members, settings) for i, p in enumerate(ports)]
    for n in nodes:
        await n.start()
    return nodes


def leader(nodes: list[Node]) -> Node | None:
    leaders = [n for n in nodes if n.replica.core is not None and n.replica.is_leader()]
    return leaders[0] if len(leaders) == 1 else None


async def commit(nodes: list[Node], command: object) -> object:
    """Propose at whichever node leads until the command commits; its outcome."""
    async with asyncio.timeout(TIMEOUT_S):
        while True:
            await until(lambda: leader(nodes) is not None)
            node = leader(nodes)
            assert node is not None
            done: asyncio.Future = asyncio.get_running_loop().create_future()
            data = encode_entry(Entry(1_000, (command,)))
            node.replica.propose(data, lambda status, out, done=done: done.done() or
                                 done.set_result((status, out)))
            status, outcomes = await done
            if status is Proposal.COMMITTED:
                return outcomes[0].result
            await asyncio.sleep(0.05)


def state(node: Node) -> object:
    """Everything in the replica's store but its own bookkeeping (the applied index); a
    store being swapped for a snapshot's reads as nothing that equals another."""
    try:
        return tuple(kv for kv in node.machine.store.scan(b"\x00", b"\xff") if kv[0] != b"s")
    except Exception:
        return object()


def send(n: int) -> c.SendMessages:
    return c.SendMessages("q", (c.SendEntry("0", f"body-{n}"),), request_id=f"r{n}",
                          message_ids=(f"m-{n}",))
