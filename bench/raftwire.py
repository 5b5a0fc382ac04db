"""What the Raft peer transport costs: encoding and decoding batches (``sqsq.shard.raftwire``)
and messages through two ``PeerTransport``s over loopback, for heartbeat-sized messages (one
per shard, coalesced per turn) and for 100 KB appends; a snapshot streamed in chunks; and
round trips between two processes.

    python -m bench.raftwire [--seconds 2] [--shards 64] [--round-trips 5000]

For the loopback figures both transports run on one event loop in this process: the whole
round of work (encode, write, read, decode, hand on) on one core. For the round trips, a
second process answers each message the moment its transport hands it on, and this one
sends the next when the answer is in: one message in flight, as on a lone send's path
(leader -> follower append, follower -> leader answer). It prints the round trip's p50 and
p99 (two hops) and each process's CPU per round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from sqsq.raft.types import ConfState, Entry, Message, MsgType, SnapshotMeta
from sqsq.shard.peers import PeerTransport
from sqsq.shard.raftwire import decode_messages, encode_messages

SECRET = b"bench"


def heartbeats(shards: int) -> list[tuple[int, Message]]:
    return [(s, Message(MsgType.HEARTBEAT, "b", "a", 7, commit=123_456, context=b"r" * 8))
            for s in range(shards)]


def appends(count: int, size: int) -> list[tuple[int, Message]]:
    return [(s, Message(MsgType.APPEND, "b", "a", 7, log_term=7, index=1000 + s, commit=999,
                        entries=(Entry(1001 + s, 7, os.urandom(size)),)))
            for s in range(count)]


def codec(label: str, batch: list[tuple[int, Message]], seconds: float) -> None:
    raw = encode_messages(batch)
    for name, work in (("encode", lambda: encode_messages(batch)),
                       ("decode", lambda: decode_messages(raw))):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            work()
            n += 1
        elapsed = time.perf_counter() - start
        print(f"  {label:<22} {name}: {n * len(batch) / elapsed:>12,.0f} msgs/s "
              f"{n * len(raw) / elapsed / 1e6:>9,.1f} MB/s  ({len(raw):,} B a batch)")


async def loopback(label: str, batch: list[tuple[int, Message]], seconds: float,
                   directory: Path) -> None:
    got = 0
    arrived = asyncio.Event()

    def on_messages(_peer: str, received: list[tuple[int, Message]]) -> None:
        nonlocal got
        got += len(received)
        arrived.set()

    a = PeerTransport("a", "127.0.0.1", 0, SECRET, lambda *_: None, lambda *_: None,
                      snapshot_dir=directory / "a")
    b = PeerTransport("b", "127.0.0.1", 0, SECRET, on_messages, lambda *_: None,
                      snapshot_dir=directory / "b")
    await a.start()
    await b.start()
    try:
        address = ("127.0.0.1", b.port)
        sent = 0
        window = 4 * len(batch)  # in flight at most: the queue's bound is never reached
        cpu, start = time.process_time(), time.perf_counter()
        while time.perf_counter() - start < seconds:
            for shard, m in batch:
                a.send("b", address, shard, m)
            sent += len(batch)
            while sent - got > window:
                arrived.clear()
                await arrived.wait()
        while got < sent:
            arrived.clear()
            await arrived.wait()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        size = sum(len(e.data) for _, m in batch for e in m.entries) or 0
        print(f"  {label:<22} {got / elapsed:>12,.0f} msgs/s  "
              f"{got * size / len(batch) / elapsed / 1e6:>7,.1f} MB/s of entries  "
              f"{cpu / got * 1e6:6.2f} us CPU a message  {a.frames_sent:,} frames "
              f"({got / max(a.frames_sent, 1):,.1f} msgs a frame), "
              f"dropped {a.messages_dropped}")
    finally:
        await a.stop()
        await b.stop()


async def snapshot(size_mb: int, directory: Path) -> None:
    path = directory / "snapshot"
    with open(path, "wb") as f:
        for _ in range(size_mb):
            f.write(os.urandom(1 << 20))
    a = PeerTransport("a", "127.0.0.1", 0, SECRET, lambda *_: None, lambda *_: None,
                      snapshot_dir=directory / "sa")
    b = PeerTransport("b", "127.0.0.1", 0, SECRET, lambda *_: None, lambda *_: None,
                      snapshot_dir=directory / "sb")
    await a.start()
    await b.start()
    try:
        meta = SnapshotMeta(10, 2, ConfState(frozenset({"a", "b", "c"})))
        start = time.perf_counter()
        ok = await a.send_snapshot("b", ("127.0.0.1", b.port), 0,
                                   Message(MsgType.SNAPSHOT, "b", "a", 2, snapshot=meta), path)
        elapsed = time.perf_counter() - start
        print(f"  snapshot {size_mb} MB          {size_mb / elapsed:>9,.0f} MB/s "
              f"(fsync included), whole: {ok}")
    finally:
        await a.stop()
        await b.stop()


def _echo(a_port: int, directory: str, pipe: Connection) -> None:
    """The answering process: every message that arrives goes straight back to "a"."""
    async def serve() -> None:
        def on_messages(_peer: str, batch: list[tuple[int, Message]]) -> None:
            for shard, m in batch:
                b.send("a", ("127.0.0.1", a_port), shard, m)

        b = PeerTransport("b", "127.0.0.1", 0, SECRET, on_messages, lambda *_: None,
                          snapshot_dir=Path(directory) / "echo")
        await b.start()
        pipe.send(b.port)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, pipe.recv)  # "measure from now"
        cpu = time.process_time()
        await loop.run_in_executor(None, pipe.recv)  # "done"
        pipe.send(time.process_time() - cpu)
        await b.stop()
    asyncio.run(serve())


async def round_trips(count: int, directory: Path) -> None:
    answered = asyncio.Event()

    def on_messages(_peer: str, _batch: list[tuple[int, Message]]) -> None:
        answered.set()

    a = PeerTransport("a", "127.0.0.1", 0, SECRET, on_messages, lambda *_: None,
                      snapshot_dir=directory / "rt")
    await a.start()
    ours, theirs = multiprocessing.Pipe()
    echo = multiprocessing.get_context("spawn").Process(
        target=_echo, args=(a.port, str(directory), theirs), daemon=True)
    echo.start()
    loop = asyncio.get_running_loop()
    try:
        address = ("127.0.0.1", await loop.run_in_executor(None, ours.recv))
        m = Message(MsgType.APPEND_RESP, "b", "a", 7, index=123_456)
        times = []
        for i in range(count + 200):  # the first 200 connect and warm up
            if i == 200:
                ours.send("start")
                cpu = time.process_time()
            started = time.perf_counter()
            answered.clear()
            a.send("b", address, 0, m)
            await answered.wait()
            times.append(time.perf_counter() - started)
        cpu = time.process_time() - cpu
        ours.send("done")
        echo_cpu = await loop.run_in_executor(None, ours.recv)
        times = sorted(times[200:])
        print(f"  round trip (2 hops)    p50 {statistics.median(times) * 1e6:6.1f} us  "
              f"p99 {times[int(len(times) * 0.99)] * 1e6:6.1f} us  CPU a round trip: "
              f"{cpu / count * 1e6:5.1f} us sender (its wait included), "
              f"{echo_cpu / count * 1e6:5.1f} us answerer")
    finally:
        await a.stop()
        echo.join(5)
        if echo.is_alive():
            echo.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--snapshot-mb", type=int, default=64)
    parser.add_argument("--round-trips", type=int, default=5000)
    args = parser.parse_args()
    hb, big = heartbeats(args.shards), appends(8, 100_000)
    print("codec")
    codec(f"heartbeat x{args.shards}", hb, args.seconds)
    codec("append 100 KB x8", big, args.seconds)
    print("loopback (two transports, one loop)")
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(loopback(f"heartbeat x{args.shards}", hb, args.seconds, Path(tmp)))
        asyncio.run(loopback("append 100 KB x8", big, args.seconds, Path(tmp)))
        asyncio.run(snapshot(args.snapshot_mb, Path(tmp)))
        print("two processes, one message in flight")
        asyncio.run(round_trips(args.round_trips, Path(tmp)))


if __name__ == "__main__":
    main()
