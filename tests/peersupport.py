"""What the Raft peer transport's tests share: nodes on 127.0.0.1 with an inbox each."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from serverproc import free_port
from sqsq.raft.types import ConfState, Message, MsgType, SnapshotMeta
from sqsq.shard import peerauth
from sqsq.shard.peers import PeerTransport

SECRET = b"the cluster secret"
TIMEOUT_S = 10.0


class Inbox:
    """What a transport handed its host, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self._changed = asyncio.Event()
        self.refuse_snapshots = False

    def on_messages(self, peer: str, batch: list[tuple[int, Message]]) -> None:
        self.events.append(("batch", peer, batch))
        self._changed.set()

    def on_snapshot(self, peer: str, shard: int, message: Message, path: Path) -> None:
        if self.refuse_snapshots:
            raise OSError("no room to install it")
        self.events.append(("snapshot", peer, shard, message, path, path.read_bytes()))
        self._changed.set()

    def batches(self) -> list[list[tuple[int, Message]]]:
        return [e[2] for e in self.events if e[0] == "batch"]

    def messages(self) -> list[tuple[str, int, Message]]:
        return [(e[1], shard, m) for e in self.events if e[0] == "batch" for shard, m in e[2]]

    def snapshots(self) -> list[tuple[Any, ...]]:
        return [e for e in self.events if e[0] == "snapshot"]

    async def wait(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(TIMEOUT_S):
            while not done():
                self._changed.clear()
                await self._changed.wait()


async def until(done: Callable[[], bool]) -> None:
    """Wait for a condition on a transport's counters or on the file system (no event to
    wait on there): looked at every few milliseconds, failing after ``TIMEOUT_S``."""
    async with asyncio.timeout(TIMEOUT_S):
        while not done():
            await asyncio.sleep(0.005)


class Node:
    def __init__(self, node_id: str, tmp_path: Path, port: int = 0, secret: bytes = SECRET,
                 **options: Any) -> None:
        self.id = node_id
        self.inbox = Inbox()
        self.port = port or free_port()
        self.staging = tmp_path / f"{node_id}-{self.port}"
        self.t = PeerTransport(node_id, "127.0.0.1", self.port, secret,
                               self.inbox.on_messages, self.inbox.on_snapshot,
                               snapshot_dir=self.staging, backoff_s=(0.01, 0.05), **options)

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def send(self, to: Node, shard: int, message: Message) -> None:
        self.t.send(to.id, to.address, shard, message)


@asynccontextmanager
async def running(*nodes: Node) -> AsyncIterator[None]:
    for node in nodes:
        await node.t.start()
    try:
        yield
    finally:
        for node in nodes:
            await node.t.stop()


def heartbeat(to: Node, frm: Node, commit: int = 0) -> Message:
    return Message(MsgType.HEARTBEAT, to.id, frm.id, 1, commit=commit)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


async def authenticated_socket(node: Node) -> tuple[asyncio.StreamReader,
                                                        asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(*node.address)
    await peerauth.dial(reader, writer, secret=SECRET, node_id="z",
                        incarnation=b"12345678", expect=node.id)
    return reader, writer


def snapshot_message(a: Node, b: Node) -> Message:
    meta = SnapshotMeta(500, 4, ConfState(frozenset({"a", "b", "c"}), frozenset({"d"})))
    return Message(MsgType.SNAPSHOT, b.id, a.id, 4, snapshot=meta)
