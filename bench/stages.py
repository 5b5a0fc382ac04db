"""Where one call's time goes: a lone ``send_message`` (one in flight, as send-c1) timed at each
hand-off between the SDK, the wire, the server's stream, the shard engine, Raft's tick thread,
the journal's fdatasync and the state machine, p50 and mean over ``--sends`` calls.

    python -m bench.stages --sends 3000
    SQSQ_FRAMES=0 python -m bench.stages --sends 3000   # on the gRPC stream, not frames

It starts its own ``sqsq server`` (127.0.0.1, a temporary data directory, stopped by pid)
with timestamps put around those hand-offs, and stamps the SDK's side the same way. Both
processes read one clock (``time.perf_counter``, CLOCK_MONOTONIC), and with one call at a
time each server record belongs to the one call under way, so the stages line up. The stamps
wrap private functions: this is a measuring tool, not an API.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.procs import Proc, free_port

pc = time.perf_counter
WARM_UP = 300
# (from, to, what happens between): server stamps, in the order a call meets them
SERVER_STAGES = [
    ("read", "xs", "stream read to the shard engine (the handler's checks, conversion)"),
    ("xs", "prop", "engine queue to the proposer, entry encoded"),
    ("prop", "fs0", "proposal to the write of its Ready (the Raft loop's turn)"),
    ("fs0", "fs1", "the Ready's log append, hard state and fdatasync (worker thread)"),
    ("fs1", "ap0", "persisted to apply (sends, then the commit round trip)"),
    ("ap0", "ap1", "apply (state machine, RocksDB write)"),
    ("ap1", "done", "apply to the proposal's callback"),
    ("done", "xe", "callback to the engine's caller"),
    ("xe", "put", "engine result to the reply on the stream's queue"),
    ("put", "yield", "reply queued to handed to the transport"),
]


# ---- the server side (run as ``python -m bench.stages --serve <sqsq server args>``) -------

def _serve(argv: list[str], out: Path) -> None:
    from sqsq.gateway import streaming
    from sqsq.shard import engine, raftstorage, replica, service, statemachine

    records: list[dict[str, float]] = []
    cur: dict[str, float] = {}

    def stamp_around(owner: Any, name: str, before: str | None, after: str | None = None,
                     ) -> None:
        inner = getattr(owner, name)
        if asyncio.iscoroutinefunction(inner):
            async def timed(*a: Any, **k: Any) -> Any:
                if before:
                    cur[before] = pc()
                result = await inner(*a, **k)
                if after:
                    cur[after] = pc()
                return result
        else:
            def timed(*a: Any, **k: Any) -> Any:  # type: ignore[misc]
                if before:
                    cur[before] = pc()
                result = inner(*a, **k)
                if after:
                    cur[after] = pc()
                return result
        setattr(owner, name, timed)

    stamp_around(streaming.StreamSession, "_start", "read")
    # (a client's send reaches the engine through ``submit``, which hands back the future
    # its entry answers: the engine's result is in hand when ``send_message_batch`` returns)
    stamp_around(engine.ShardEngine, "submit", "xs")
    stamp_around(service.ShardService, "send_message_batch", None, "xe")
    stamp_around(statemachine.ShardMachine, "apply_entry", "ap0", "ap1")
    stamp_around(streaming.StreamSession, "_run", None, "put")

    persist = raftstorage.RaftStorage.persist

    def timed_persist(self: Any, entries: Any, hard_state: Any) -> None:
        started = pc()
        persist(self, entries, hard_state)
        if entries and "prop" in cur and "fs0" not in cur:
            cur["fs0"], cur["fs1"] = started, pc()
    raftstorage.RaftStorage.persist = timed_persist  # type: ignore[method-assign]

    propose = replica.RaftReplica.propose

    def timed_propose(self: Any, data: bytes, done: Any) -> None:
        cur["prop"] = pc()

        def stamped(*a: Any) -> None:
            cur["done"] = pc()
            done(*a)
        propose(self, data, stamped)
    replica.RaftReplica.propose = timed_propose  # type: ignore[method-assign]

    take_frame = streaming.StreamSession.take_frame

    def timed_take_frame(self: Any) -> Any:  # a gRPC stream's or a frame connection's
        taken = take_frame(self)
        if taken[0] is not None:
            cur["yield"] = pc()
            if "xs" in cur:
                records.append(dict(cur))
            cur.clear()
        return taken
    streaming.StreamSession.take_frame = timed_take_frame  # type: ignore[method-assign]

    run_recording(argv, out, records)


def run_recording(argv: list[str], out: Path, records: list[Any]) -> None:
    """Run ``sqsq argv`` in this process: SIGUSR1 writes ``records`` to ``out`` (a line
    each) and forgets them, SIGUSR2 forgets them (the warm-up's)."""
    def dump(*_: Any) -> None:
        written = out.with_suffix(".part")  # renamed whole: the reader never sees half of it
        written.write_text("".join(repr(r) + "\n" for r in records))
        written.replace(out)
        records.clear()
    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, lambda *_: records.clear())

    from sqsq.cli.main import main
    sys.argv = ["sqsq", *argv]
    sys.exit(main())


# ---- the client side --------------------------------------------------------------------

async def _calls(endpoint: str, server_pid: int, sends: int, out: Path) -> None:
    from sqsq.client import AsyncClient, _frames, _stream

    cur: dict[str, float] = {}
    call, frame, response = _stream._AioCalls.call, _stream._frame, _stream._response

    async def timed_call(self: Any, *a: Any) -> Any:
        cur["c1"] = pc()
        return await call(self, *a)

    def timed_frame(*a: Any) -> Any:
        cur["w"] = pc()
        return frame(*a)

    def timed_response(reply: Any) -> Any:
        cur["resp"] = pc()
        return response(reply)
    _stream._AioCalls.call = timed_call  # type: ignore[method-assign]
    _stream._frame, _stream._response = timed_frame, timed_response
    _frames._frame = timed_frame  # (imported by name there)

    client = AsyncClient(endpoint)
    rows, (server,) = await lone_sends(client, "bench-stages", sends, cur, {server_pid: out})
    _report(rows, server)


async def lone_sends(client: Any, queue_name: str, sends: int, cur: dict[str, Any],
                     servers: dict[int, Path]) -> tuple[list[dict[str, Any]], list[list[Any]]]:
    """``sends`` sends of 100 bytes, one at a time, after a warm-up: each call's stamps
    (what the client's hooks put in ``cur``, with its start and end), and what each server
    process (pid: its output file, ``run_recording``) recorded meanwhile. Closes ``client``."""
    queue = await client.create_queue(queue_name)
    for _ in range(WARM_UP):
        await client.send_message(queue, "x" * 100)
    for pid in servers:
        os.kill(pid, signal.SIGUSR2)
    rows = []
    for _ in range(sends):
        cur.clear()
        started = pc()
        await client.send_message(queue, "x" * 100)
        rows.append(dict(cur, t0=started, end=pc()))
    await client.close()
    for pid in servers:
        os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while not all(out.exists() for out in servers.values()):
        if time.monotonic() > deadline:
            raise TimeoutError("a server process wrote no stamps")
        await asyncio.sleep(0.05)
    return rows, [[ast.literal_eval(line) for line in out.read_text().splitlines()]
                  for out in servers.values()]


def _report(rows: list[dict[str, float]], server: list[dict[str, float]]) -> None:
    stages: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        stages.setdefault(name, []).append(value * 1e3)

    j = 0
    for row in rows:
        while j < len(server) and server[j]["read"] < row["t0"]:
            j += 1
        if j == len(server):
            break
        s = server[j]
        if s["read"] > row["end"] or any(k not in s for k, _, _ in SERVER_STAGES):
            continue
        add("SDK: call to its stream", row["c1"] - row["t0"])
        add("SDK: stream to the frame written", row["w"] - row["c1"])
        add("wire in: frame written to read by the server", s["read"] - row["w"])
        for a, b, what in SERVER_STAGES:
            add(f"server: {what}", s[b] - s[a])
        add("wire out: reply handed to the transport to read by the SDK",
            row["resp"] - s["yield"])
        add("SDK: reply to the caller", row["end"] - row["resp"])
        add("total (the caller's send_message)", row["end"] - row["t0"])
    width = max(len(k) for k in stages)
    n = len(stages.get("total (the caller's send_message)", []))
    print(f"{n} lone sends, ms:  {'p50':>7} {'mean':>7}")
    for name, values in stages.items():
        values.sort()
        print(f"{name:<{width}}  {values[len(values) // 2]:7.3f} "
              f"{sum(values) / len(values):7.3f}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        _serve(sys.argv[3:], Path(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sends", type=int, default=3000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sqsq-stages-") as tmp:
        root = Path(tmp)
        grpc_port, http_port = free_port(), free_port()
        stamps = root / "stamps.txt"
        server = Proc("sqsq server", [
            sys.executable, "-m", "bench.stages", "--serve", str(stamps), "server",
            "--data-dir", str(root / "data"), "--host", "127.0.0.1",
            "--grpc-port", str(grpc_port), "--http-port", str(http_port)],
            root / "server.log")
        try:
            server.wait_port(grpc_port)
            asyncio.run(_calls(f"127.0.0.1:{grpc_port}", server.pid, args.sends, stamps))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
