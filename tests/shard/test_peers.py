"""The Raft peer transport between real sockets on 127.0.0.1: one connection per node pair
for every shard, heartbeats coalesced, peers proven by the cluster secret, frames bounded,
restarts survived."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from peersupport import (
    SECRET,
    TIMEOUT_S,
    Node,
    authenticated_socket,
    heartbeat,
    run,
    running,
    until,
)
from sqsq.raft.types import Entry, Message, MsgType
from sqsq.shard import peerauth, peerconns
from sqsq.shard.peerlink import KIND_MESSAGES
from sqsq.shard.peers import MAX_FRAME_BYTES
from sqsq.shard.raftwire import encode_messages


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


def test_an_oversized_frame_closes_the_connection_before_it_is_read(tmp_path: Path) -> None:
    async def scenario() -> None:
        a = Node("a", tmp_path)
        async with running(a):
            reader, writer = await authenticated_socket(a)
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
            reader, writer = await authenticated_socket(a)
            writer.write(struct.pack(">IB", 5, 1) + b"\x93\x01\x02\x03")  # [1, 2, 3]
            async with asyncio.timeout(TIMEOUT_S):
                assert await reader.read() == b""
            writer.close()
            assert a.t.bad_frames == 1 and a.inbox.events == []

    run(scenario)


def test_a_connection_that_does_not_authenticate_in_time_is_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peerconns, "HANDSHAKE_TIMEOUT_S", 0.2)

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
    monkeypatch.setattr(peerconns, "MAX_PENDING_HANDSHAKES", 2)

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


def test_a_frame_of_a_kind_this_node_does_not_know_is_skipped(tmp_path: Path) -> None:
    """A newer node's frame kind must not cut the connection: nodes are upgraded in turn."""
    async def scenario() -> None:
        a = Node("a", tmp_path)
        async with running(a):
            reader, writer = await authenticated_socket(a)
            writer.write(struct.pack(">IB", 5, 200) + b"\x93\x01\x02\x03")
            batch = encode_messages([(7, Message(MsgType.HEARTBEAT, "a", "z", 1))])
            writer.write(struct.pack(">IB", len(batch) + 1, KIND_MESSAGES) + batch)
            await until(lambda: a.inbox.events != [])
            assert a.t.unknown_frames == 1 and a.t.bad_frames == 0
            writer.close()

    run(scenario)


@pytest.mark.parametrize("followed", [True, False], ids=["with-messages", "alone"])
def test_write_sets_reach_the_peer_ahead_of_messages_or_on_their_own(
        tmp_path: Path, followed: bool) -> None:
    async def scenario() -> None:
        got: list[tuple[str, list]] = []
        a = Node("a", tmp_path)
        b = Node("b", tmp_path, on_write_sets=lambda peer, sets: got.append((peer, sets)))
        async with running(a, b):
            a.send(b, 1, heartbeat(b, a))  # connects
            await until(lambda: len(b.inbox.events) == 1)
            a.t.send_write_sets(b.id, b.address, 3, [(10, 2, 99, b"writes"), (11, 2, 98, None)])
            if followed:  # they ride with the next message, ahead of it
                a.send(b, 3, heartbeat(b, a, commit=11))
                await until(lambda: len(b.inbox.events) == 2)
            else:  # nothing follows: they leave after a short linger
                await until(lambda: got != [])
            assert got == [("a", [(3, 10, 2, 99, b"writes"), (3, 11, 2, 98, None)])]

    run(scenario)


def test_write_sets_queued_after_others_rode_with_a_message_wait_out_their_own_linger(
        tmp_path: Path) -> None:
    """A linger's timer set for write sets that have since left with a message does not send
    the newer ones alone: they wait for the next message (or their own linger's end)."""
    async def scenario() -> None:
        got: list[tuple[str, list]] = []
        a = Node("a", tmp_path)
        b = Node("b", tmp_path, on_write_sets=lambda peer, sets: got.append((peer, sets)))
        async with running(a, b):
            a.send(b, 1, heartbeat(b, a))  # connects
            await until(lambda: len(b.inbox.events) == 1)
            a.t.send_write_sets(b.id, b.address, 3, [(10, 2, 99, b"ten")])
            a.send(b, 3, heartbeat(b, a, commit=10))  # they ride with it
            await until(lambda: len(b.inbox.events) == 2)
            a.t.send_write_sets(b.id, b.address, 3, [(11, 2, 98, b"eleven")])
            sent = a.t.frames_sent
            a.t._flush_write_sets(a.t._peers[b.id])  # the first linger's timer ends
            assert a.t.frames_sent == sent  # nothing left on its own
            a.send(b, 3, heartbeat(b, a, commit=11))
            await until(lambda: len(b.inbox.events) == 3)
            assert got == [("a", [(3, 10, 2, 99, b"ten")]), ("a", [(3, 11, 2, 98, b"eleven")])]

    run(scenario)


def _batch_frame(*messages: Message) -> bytes:
    batch = encode_messages([(i, m) for i, m in enumerate(messages)])
    return struct.pack(">IB", len(batch) + 1, KIND_MESSAGES) + batch


def test_frames_arrive_whole_however_the_bytes_are_cut(tmp_path: Path) -> None:
    """Frames are cut out of whatever each read brings: a frame split byte by byte, one
    larger than the read buffer (a 1 MB entry) with small ones before and after it in the
    same write, and small ones again once the large one's buffer was given up."""
    async def scenario() -> None:
        a = Node("a", tmp_path)
        async with running(a):
            reader, writer = await authenticated_socket(a)
            small = [Message(MsgType.HEARTBEAT, "a", "z", 1, commit=i) for i in range(4)]
            big = Message(MsgType.APPEND, "a", "z", 1, index=9,
                          entries=(Entry(10, 1, bytes(range(256)) * 4096),))
            for byte in _batch_frame(small[0]):
                writer.write(bytes([byte]))
                await writer.drain()
            writer.write(_batch_frame(small[1]) + _batch_frame(big) + _batch_frame(small[2]))
            writer.write(_batch_frame(small[3]) * 3)
            await a.inbox.wait(lambda: len(a.inbox.batches()) == 7)
            got = [m for _, _, m in a.inbox.messages()]
            assert got == [small[0], small[1], big, small[2]] + [small[3]] * 3
            assert a.t.bad_frames == a.t.oversized_frames == 0
            writer.close()

    run(scenario)


def test_frames_sent_right_behind_the_handshake_are_delivered(tmp_path: Path) -> None:
    """A peer may write its first frames in the same write as its last handshake step: they
    wait, unread, until the handshake is checked, and are then handed on."""
    async def scenario() -> None:
        a = Node("a", tmp_path)
        async with running(a):
            reader, writer = await asyncio.open_connection(*a.address)
            first = Message(MsgType.HEARTBEAT, "a", "z", 1, commit=5)
            frames = _batch_frame(first) + _batch_frame(first, first)
            # The dialer's one handshake write, with the frames behind it.
            await peerauth.dial_frames(
                lambda: peerauth.read_frame(reader, peerauth.HANDSHAKE_MAX_BYTES),
                lambda hello: writer.write(hello + frames), secret=SECRET, node_id="z",
                incarnation=b"12345678", expect=a.id)
            await a.inbox.wait(lambda: len(a.inbox.messages()) == 3)
            assert [m for _, _, m in a.inbox.messages()] == [first] * 3
            writer.close()

    run(scenario)
