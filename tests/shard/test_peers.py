"""The Raft peer transport between real sockets on 127.0.0.1: one connection per node pair
for every shard, heartbeats coalesced, peers proven by the cluster secret, frames bounded,
restarts survived, snapshots delivered whole or not at all."""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
from collections.abc import Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from serverproc import free_port
from sqsq.raft.types import ConfState, Entry, Message, MsgType, SnapshotMeta
from sqsq.shard import peerauth, peers
from sqsq.shard.peers import MAX_FRAME_BYTES, PeerTransport
from sqsq.shard.raftwire import Chunk, encode_chunk

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
async def running(*nodes: Node) -> Iterator[None]:  # type: ignore[misc]
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


def test_every_shards_messages_share_one_connection_in_order(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = Node("a", tmp_path), Node("b", tmp_path)
        async with running(a, b):
            a.send(b, 0, heartbeat(b, a))
            await b.inbox.wait(lambda: len(b.inbox.messages()) == 1)  # connected
            sent = b.inbox.messages()
            for i in range(60):
                m = Message(MsgType.APPEND, "b", "a", 2, index=i,
                            entries=(Entry(i + 1, 2, b"x" * i),))
                a.send(b, i % 5, m)
                sent.append(("a", i % 5, m))
                if i % 7 == 0:
                    await asyncio.sleep(0)  # spread over several loop turns, several frames
            await b.inbox.wait(lambda: len(b.inbox.messages()) == 61)
            assert b.inbox.messages() == sent
            b.send(a, 3, Message(MsgType.APPEND_RESP, "a", "b", 2, index=59))
            await a.inbox.wait(lambda: len(a.inbox.messages()) == 1)
            # The answer came back over the connection a dialed: one for the pair.
            assert a.t.connections() == {"b": 1} and b.t.connections() == {"a": 1}
            assert a.t.frames_sent > 2 and b.t.connects == 1

    run(scenario)


def test_three_nodes_keep_one_connection_per_pair(tmp_path: Path) -> None:
    async def scenario() -> None:
        nodes = [Node(name, tmp_path) for name in "abc"]
        async with running(*nodes):
            for turn in range(3):
                for frm in nodes:
                    for to in nodes:
                        if to is not frm:
                            for shard in range(4):
                                frm.send(to, shard, heartbeat(to, frm, commit=turn))
                await asyncio.sleep(0)
            for node in nodes:
                await node.inbox.wait(lambda node=node: len(node.inbox.messages()) == 24)
                others = {n.id for n in nodes} - {node.id}
                assert {peer for peer, _, _ in node.inbox.messages()} == others
                for peer in others:  # in order per sender and shard
                    assert [m.commit for p, s, m in node.inbox.messages()
                            if p == peer and s == 2] == [0, 1, 2]
            for node in nodes:
                await until(lambda node=node: node.t.connections() == dict.fromkeys(
                    {n.id for n in nodes} - {node.id}, 1))

    run(scenario)


def test_heartbeats_of_many_shards_queued_in_one_turn_travel_in_one_frame(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = Node("a", tmp_path), Node("b", tmp_path)
        async with running(a, b):
            a.send(b, 0, heartbeat(b, a))
            await b.inbox.wait(lambda: len(b.inbox.messages()) == 1)
            frames, received = a.t.frames_sent, b.t.frames_received
            for shard in range(64):
                a.send(b, shard, heartbeat(b, a, commit=shard))
            await b.inbox.wait(lambda: len(b.inbox.messages()) == 65)
            assert a.t.frames_sent - frames == 1
            assert b.t.frames_received - received == 1
            assert [shard for shard, _ in b.inbox.batches()[-1]] == list(range(64))

    run(scenario)


def test_two_nodes_dialing_each_other_at_once_settle_on_one_connection(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = Node("a", tmp_path), Node("b", tmp_path)
        async with running(a, b):
            a.send(b, 1, heartbeat(b, a))
            b.send(a, 1, heartbeat(a, b))  # both dial: two connections for a moment
            await b.inbox.wait(lambda: len(b.inbox.messages()) == 1)
            await a.inbox.wait(lambda: len(a.inbox.messages()) == 1)
            await until(lambda: a.t.connections() == {"b": 1} == {"b": b.t.connections().get(
                "a", 0)})
            for shard in range(2, 10):
                a.send(b, shard, heartbeat(b, a))
                b.send(a, shard, heartbeat(a, b))
                await asyncio.sleep(0)
            await b.inbox.wait(lambda: len(b.inbox.messages()) == 9)
            await a.inbox.wait(lambda: len(a.inbox.messages()) == 9)
            assert a.t.connections() == {"b": 1} and b.t.connections() == {"a": 1}
            assert (a.t.connects, b.t.connects) == (2, 2)  # both dials did connect

    run(scenario)


def test_a_peer_without_the_secret_is_refused_and_nothing_it_sent_is_delivered(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = Node("a", tmp_path), Node("b", tmp_path)
        intruder = Node("c", tmp_path, secret=b"a guess")
        async with running(a, b, intruder):
            for shard in range(3):
                intruder.send(a, shard, Message(MsgType.VOTE, "a", "c", 99))
            await until(lambda: a.t.auth_failures >= 1)
            b.send(a, 0, heartbeat(a, b))
            await a.inbox.wait(lambda: len(a.inbox.messages()) == 1)
            assert [peer for peer, _, _ in a.inbox.messages()] == ["b"]
            assert a.t.frames_received == 1 and a.t.connections() == {"b": 1}

    run(scenario)


def test_a_node_is_not_handed_messages_meant_for_another(tmp_path: Path) -> None:
    """An address that now belongs to another node (same secret, other id) is not trusted
    with a peer's messages."""
    async def scenario() -> None:
        a, c = Node("a", tmp_path), Node("c", tmp_path)
        async with running(a, c):
            a.t.send("b", c.address, 0, Message(MsgType.APPEND, "b", "a", 1))
            await until(lambda: a.t.auth_failures >= 1)
            assert c.inbox.events == [] and c.t.frames_received == 0

    run(scenario)


def _listeners(port: int) -> list[str]:
    """The local addresses of the sockets listening on ``port`` (hex, as the kernel
    writes them)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.append(address)
    return found


def test_it_listens_on_the_given_address_only(tmp_path: Path) -> None:
    async def scenario() -> None:
        a = Node("a", tmp_path)
        async with running(a):
            assert _listeners(a.port) == ["0100007F"]  # 127.0.0.1, not 0.0.0.0 nor ::
        assert _listeners(a.port) == []

    run(scenario)


async def _authenticated_socket(node: Node) -> tuple[asyncio.StreamReader,
                                                        asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(*node.address)
    await peerauth.dial(reader, writer, secret=SECRET, node_id="z",
                        incarnation=b"12345678", expect=node.id)
    return reader, writer


def test_an_oversized_frame_closes_the_connection_before_it_is_read(tmp_path: Path) -> None:
    async def scenario() -> None:
        a = Node("a", tmp_path)
        async with running(a):
            reader, writer = await _authenticated_socket(a)
            writer.write(struct.pack(">IB", MAX_FRAME_BYTES + 1, 1))  # and no payload
            async with asyncio.timeout(TIMEOUT_S):
                assert await reader.read() == b""  # closed by a
            writer.close()
            # Before authenticating, even a few KB is too much.
            reader, writer = await asyncio.open_connection(*a.address)
            await reader.readexactly(4 + 36)  # the server's challenge
            writer.write(struct.pack(">I", 1 << 20))
            async with asyncio.timeout(TIMEOUT_S):
                assert await reader.read() == b""
            writer.close()
            assert a.t.oversized_frames == 2 and a.inbox.events == []

    run(scenario)


def test_a_frame_that_is_not_a_batch_closes_the_connection(tmp_path: Path) -> None:
    async def scenario() -> None:
        a = Node("a", tmp_path)
        async with running(a):
            reader, writer = await _authenticated_socket(a)
            writer.write(struct.pack(">IB", 5, 1) + b"\x93\x01\x02\x03")  # [1, 2, 3]
            async with asyncio.timeout(TIMEOUT_S):
                assert await reader.read() == b""
            writer.close()
            assert a.t.bad_frames == 1 and a.inbox.events == []

    run(scenario)


def test_a_connection_that_does_not_authenticate_in_time_is_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "HANDSHAKE_TIMEOUT_S", 0.2)

    async def scenario() -> None:
        a = Node("a", tmp_path)
        async with running(a):
            reader, writer = await asyncio.open_connection(*a.address)
            await reader.readexactly(4 + 36)  # the challenge; then silence
            async with asyncio.timeout(TIMEOUT_S):
                assert await reader.read() == b""
            writer.close()

    run(scenario)


def test_connections_still_authenticating_are_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "MAX_PENDING_HANDSHAKES", 2)

    async def scenario() -> None:
        a = Node("a", tmp_path)
        async with running(a):
            held = [await asyncio.open_connection(*a.address) for _ in range(2)]
            for reader, _ in held:
                await reader.readexactly(4 + 36)  # both are being authenticated
            reader, writer = await asyncio.open_connection(*a.address)
            async with asyncio.timeout(TIMEOUT_S):
                assert await reader.read() == b""  # the third is not even challenged
            writer.close()
            for _, w in held:
                w.close()
            await until(lambda: a.t._handshakes == 0)  # noqa: SLF001
            b = Node("b", tmp_path)  # and once they are gone, a peer gets in
            async with running(b):
                b.send(a, 0, heartbeat(a, b))
                await a.inbox.wait(lambda: len(a.inbox.messages()) == 1)

    run(scenario)


def test_a_peer_that_does_not_read_costs_a_bounded_buffer(tmp_path: Path) -> None:
    async def scenario() -> None:
        a = Node("a", tmp_path, max_write_buffer_bytes=1 << 20)
        stuck: list[asyncio.StreamWriter] = []

        async def never_reads(reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
            await peerauth.accept(reader, writer, secret=SECRET, node_id="b",
                                  incarnation=b"87654321")
            stuck.append(writer)

        server = await asyncio.start_server(never_reads, "127.0.0.1", 0)
        address = server.sockets[0].getsockname()[:2]
        try:
            async with running(a):
                append = Message(MsgType.APPEND, "b", "a", 1,
                                 entries=(Entry(1, 1, b"x" * 100_000),))
                for _ in range(2000):  # 200 MB, were nothing dropped
                    a.t.send("b", address, 0, append)
                    await asyncio.sleep(0)  # a loop turn: the batch is written
                    if a.t.messages_dropped:
                        break
                assert a.t.messages_dropped == 1 and stuck
        finally:
            for writer in stuck:
                writer.close()
            server.close()

    run(scenario)


def test_a_forgotten_peer_is_disconnected(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = Node("a", tmp_path), Node("b", tmp_path)
        async with running(a, b):
            a.send(b, 0, heartbeat(b, a))
            await b.inbox.wait(lambda: len(b.inbox.messages()) == 1)
            a.t.forget("b")
            assert a.t.connections() == {}
            await until(lambda: b.t.connections() == {})

    run(scenario)


def test_a_snapshot_chunk_out_of_order_closes_the_connection(tmp_path: Path) -> None:
    async def scenario() -> None:
        a = Node("a", tmp_path)
        async with running(a):
            reader, writer = await _authenticated_socket(a)
            payload = encode_chunk(Chunk(1, 1, False, 3, 500, 4, b"data"))  # no first chunk
            writer.write(struct.pack(">IB", len(payload) + 1, 2) + payload)
            async with asyncio.timeout(TIMEOUT_S):
                assert await reader.read() == b""
            writer.close()
            assert a.t.bad_frames == 1 and not any(a.staging.iterdir())

    run(scenario)


def test_a_peer_that_restarts_is_reconnected_and_gets_what_was_queued(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = Node("a", tmp_path), Node("b", tmp_path)
        async with running(a):
            async with running(b):
                a.send(b, 0, heartbeat(b, a, commit=1))
                await b.inbox.wait(lambda: len(b.inbox.messages()) == 1)
            await until(lambda: a.t.connections() == {})  # a saw the connection go
            a.send(b, 0, heartbeat(b, a, commit=2))  # b is down: a retries, backing off
            await until(lambda: a.t.connect_failures >= 1)
            b2 = Node("b", tmp_path, port=b.port)
            async with running(b2):
                await b2.inbox.wait(lambda: len(b2.inbox.messages()) == 1)
                assert b2.inbox.messages()[0][2].commit == 2
                assert a.t.reconnects == 1 and a.t.connections() == {"b": 1}

    run(scenario)


def test_a_restarted_peer_replaces_a_connection_that_still_looks_alive(
        tmp_path: Path) -> None:
    """A machine that crashed leaves a half-open connection the survivor cannot tell from a
    live one; when the peer comes back (a new incarnation) and dials, its new connection is
    the one used. (Played here by a second "b" while the first still runs.)"""
    async def scenario() -> None:
        a, old = Node("a", tmp_path), Node("b", tmp_path)
        new = Node("b", tmp_path)
        async with running(a, old, new):
            a.send(old, 0, heartbeat(old, a, commit=1))  # a dials: the connection a keeps
            await old.inbox.wait(lambda: len(old.inbox.messages()) == 1)
            new.send(a, 0, heartbeat(a, new))
            await a.inbox.wait(lambda: len(a.inbox.messages()) == 1)
            a.send(new, 0, heartbeat(new, a, commit=2))
            await new.inbox.wait(lambda: len(new.inbox.messages()) == 1)
            assert len(old.inbox.messages()) == 1 and a.t.connections() == {"b": 1}

    run(scenario)


def test_while_a_peer_is_down_the_queue_keeps_the_newest_within_its_bound(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = Node("a", tmp_path, max_queue_messages=10), Node("b", tmp_path)
        async with running(a):
            for commit in range(25):
                a.send(b, 0, heartbeat(b, a, commit=commit))  # never blocks
            assert a.t.messages_dropped == 15
            await until(lambda: a.t.connect_failures >= 1)
            async with running(b):
                await b.inbox.wait(lambda: len(b.inbox.messages()) == 10)
                assert [m.commit for _, _, m in b.inbox.messages()] == list(range(15, 25))

    run(scenario)


def _snapshot_message(a: Node, b: Node) -> Message:
    meta = SnapshotMeta(500, 4, ConfState(frozenset({"a", "b", "c"}), frozenset({"d"})))
    return Message(MsgType.SNAPSHOT, b.id, a.id, 4, snapshot=meta)


def test_a_snapshot_of_a_few_mb_arrives_whole_and_is_handed_on_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = Node("a", tmp_path), Node("b", tmp_path)
        data = os.urandom(6 * (1 << 20) + 12345)
        path = tmp_path / "snapshot"
        path.write_bytes(data)
        message = _snapshot_message(a, b)
        async with running(a, b):
            done = a.t.send_snapshot("b", b.address, 3, message, path)
            async with asyncio.timeout(TIMEOUT_S):
                assert await done is True
            (snap,) = b.inbox.snapshots()
            _, peer, shard, got, where, contents = snap
            assert (peer, shard, got, contents == data) == ("a", 3, message, True)
            assert sorted(p.name for p in b.staging.iterdir()) == [where.name]
            assert (a.t.snapshots_sent, b.t.snapshots_received) == (1, 1)
            assert b.t.frames_received == 7  # 1 MiB chunks

    run(scenario)


def test_other_shards_messages_flow_while_a_snapshot_is_in_transfer(tmp_path: Path) -> None:
    async def scenario() -> None:
        chunk = 64 << 10
        a, b = Node("a", tmp_path, chunk_bytes=chunk), Node("b", tmp_path)
        # A pipe as the snapshot "file": the sender sends what the test wrote and waits for
        # more, so the transfer is held open for as long as the test likes.
        fifo = tmp_path / "snapshot.fifo"
        os.mkfifo(fifo)
        data = os.urandom(5 * chunk)
        async with running(a, b):
            done = a.t.send_snapshot("b", b.address, 3, _snapshot_message(a, b), fifo)
            writer = await asyncio.to_thread(open, fifo, "wb")
            try:
                await asyncio.to_thread(writer.write, data[:3 * chunk])
                await asyncio.to_thread(writer.flush)
                await until(lambda: any(b.staging.iterdir()))  # under way
                for shard in (4, 5):
                    a.send(b, shard, heartbeat(b, a))
                await b.inbox.wait(lambda: len(b.inbox.messages()) == 2)
                assert not done.done() and b.inbox.snapshots() == []
                await asyncio.to_thread(writer.write, data[3 * chunk:])
            finally:
                await asyncio.to_thread(writer.close)
            async with asyncio.timeout(TIMEOUT_S):
                assert await done is True
            assert [e[0] for e in b.inbox.events] == ["batch", "snapshot"]
            assert b.inbox.snapshots()[0][-1] == data

    run(scenario)


def test_a_connection_cut_mid_snapshot_leaves_no_file_and_reports_failure(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        chunk = 64 << 10
        a, b = Node("a", tmp_path, chunk_bytes=chunk), Node("b", tmp_path)
        # A pipe as the snapshot "file": the sender reads what the test writes, and then
        # waits for more, so the transfer is cut at a point the test chose.
        fifo = tmp_path / "snapshot.fifo"
        os.mkfifo(fifo)
        await a.t.start()
        await b.t.start()
        writer = None
        try:
            done = a.t.send_snapshot("b", b.address, 3, _snapshot_message(a, b), fifo)
            writer = await asyncio.to_thread(open, fifo, "wb")
            await asyncio.to_thread(writer.write, os.urandom(3 * chunk))
            await asyncio.to_thread(writer.flush)
            await until(lambda: sum(p.stat().st_size for p in b.staging.iterdir()) >= chunk)
            await a.t.stop()  # cut
            async with asyncio.timeout(TIMEOUT_S):
                assert await done is False
            await until(lambda: not any(b.staging.iterdir()))
            assert b.inbox.events == [] and b.t.snapshots_discarded == 1
            assert a.t.snapshots_failed == 1
        finally:
            if writer is not None:
                writer.close()  # ends the sender's blocked read
            await a.t.stop()
            await b.t.stop()

    run(scenario)


def test_a_snapshot_the_host_cannot_take_is_reported_failed(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = Node("a", tmp_path), Node("b", tmp_path)
        b.inbox.refuse_snapshots = True
        path = tmp_path / "snapshot"
        path.write_bytes(b"state" * 1000)
        async with running(a, b):
            done = a.t.send_snapshot("b", b.address, 3, _snapshot_message(a, b), path)
            async with asyncio.timeout(TIMEOUT_S):
                assert await done is False
            assert a.t.snapshots_failed == 1 and a.t.connections() == {"b": 1}

    run(scenario)


def test_a_snapshot_file_that_cannot_be_read_is_reported_failed(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = Node("a", tmp_path), Node("b", tmp_path)
        async with running(a, b):
            done = a.t.send_snapshot("b", b.address, 3, _snapshot_message(a, b),
                                     tmp_path / "missing")
            async with asyncio.timeout(TIMEOUT_S):
                assert await done is False
            assert b.inbox.events == [] and not any(b.staging.iterdir())

    run(scenario)


def test_a_snapshot_the_receiver_cannot_store_fails_but_keeps_the_connection(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = Node("a", tmp_path, chunk_bytes=64 << 10), Node("b", tmp_path)
        path = tmp_path / "snapshot"
        path.write_bytes(os.urandom(1 << 20))
        async with running(a, b):
            a.send(b, 0, heartbeat(b, a))
            await b.inbox.wait(lambda: len(b.inbox.messages()) == 1)
            shutil.rmtree(b.staging)  # its disk fails it: no staging file can be made
            done = a.t.send_snapshot("b", b.address, 3, _snapshot_message(a, b), path)
            async with asyncio.timeout(TIMEOUT_S):
                assert await done is False
            a.send(b, 0, heartbeat(b, a))  # the connection carries on
            await b.inbox.wait(lambda: len(b.inbox.messages()) == 2)
            assert b.t.bad_frames == 0 and a.t.connects == 1 and b.inbox.snapshots() == []

    run(scenario)
