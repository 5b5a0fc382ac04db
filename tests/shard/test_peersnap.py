"""Snapshots over the Raft peer transport: streamed in chunks between other shards'
messages, handed on only whole and durable, and a transfer that does not finish leaves no
file and is reported failed."""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
from pathlib import Path

from peersupport import (
    TIMEOUT_S,
    Node,
    authenticated_socket,
    heartbeat,
    run,
    running,
    snapshot_message,
    until,
)
from sqsq.shard.raftwire import Chunk, encode_chunk


def test_a_snapshot_chunk_out_of_order_closes_the_connection(tmp_path: Path) -> None:
    async def scenario() -> None:
        a = Node("a", tmp_path)
        async with running(a):
            reader, writer = await authenticated_socket(a)
            payload = encode_chunk(Chunk(1, 1, False, 3, 500, 4, b"data"))  # no first chunk
            writer.write(struct.pack(">IB", len(payload) + 1, 2) + payload)
            async with asyncio.timeout(TIMEOUT_S):
                assert await reader.read() == b""
            writer.close()
            assert a.t.bad_frames == 1 and not any(a.staging.iterdir())

    run(scenario)


def test_a_snapshot_of_a_few_mb_arrives_whole_and_is_handed_on_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = Node("a", tmp_path), Node("b", tmp_path)
        data = os.urandom(6 * (1 << 20) + 12345)
        path = tmp_path / "snapshot"
        path.write_bytes(data)
        message = snapshot_message(a, b)
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
            done = a.t.send_snapshot("b", b.address, 3, snapshot_message(a, b), fifo)
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
            done = a.t.send_snapshot("b", b.address, 3, snapshot_message(a, b), fifo)
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
            done = a.t.send_snapshot("b", b.address, 3, snapshot_message(a, b), path)
            async with asyncio.timeout(TIMEOUT_S):
                assert await done is False
            assert a.t.snapshots_failed == 1 and a.t.connections() == {"b": 1}

    run(scenario)


def test_a_snapshot_file_that_cannot_be_read_is_reported_failed(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = Node("a", tmp_path), Node("b", tmp_path)
        async with running(a, b):
            done = a.t.send_snapshot("b", b.address, 3, snapshot_message(a, b),
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
            done = a.t.send_snapshot("b", b.address, 3, snapshot_message(a, b), path)
            async with asyncio.timeout(TIMEOUT_S):
                assert await done is False
            a.send(b, 0, heartbeat(b, a))  # the connection carries on
            await b.inbox.wait(lambda: len(b.inbox.messages()) == 2)
            assert b.t.bad_frames == 0 and a.t.connects == 1 and b.inbox.snapshots() == []

    run(scenario)
