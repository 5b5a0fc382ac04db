"""Where a replicated send's time goes: a lone ``send_message`` (one in flight, as send-c1)
against three ``sqsq node`` processes (as the ``sqsq-r3`` target starts them), timed at each
hand-off on the leader and on both followers: the client's frame read, the engine, the
proposal, the Ready, the appends sent, the followers' receipt, fdatasync and answer, the
leader's commit, apply and reply.

    python -m bench.r3stages --sends 2000

Every node records what it did with a timestamp (``time.perf_counter``: CLOCK_MONOTONIC,
one clock for every process on the machine); with one call at a time, what a node did
between a call's start and its end belongs to that call. For each event the p50 of its time
since the call began is printed, in the order they happen, per role: L the leader, F1 the
follower whose answer came first, F2 the other. Then the slowest 2% of the calls: for each,
the step (one role's time between two of its events, or a hop between the client and the
leader) furthest over its p50, and the garbage collections and node ticks during it; every
stamp of the three slowest. The stamps wrap private functions: this is a measuring tool, not
an API.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.procs import Proc, free_port
from bench.stages import lone_sends, run_recording

pc = time.perf_counter


# ---- a node (run as ``python -m bench.r3stages --serve <file> <sqsq node args>``) ---------

def _serve(argv: list[str], out: Path) -> None:
    from sqsq.gateway import frames, streaming
    from sqsq.raft import node as raftnode
    from sqsq.raft.types import MsgType
    from sqsq.shard import engine, peers, raftstorage, replica, replicas, statemachine

    events: list[tuple[str, float]] = []
    note = events.append

    def around(owner: Any, name: str, before: str | None, after: str | None = None) -> None:
        inner = getattr(owner, name)
        if asyncio.iscoroutinefunction(inner):
            async def timed(*a: Any, **k: Any) -> Any:
                if before:
                    note((before, pc()))
                result = await inner(*a, **k)
                if after:
                    note((after, pc()))
                return result
        else:
            def timed(*a: Any, **k: Any) -> Any:  # type: ignore[misc]
                if before:
                    note((before, pc()))
                result = inner(*a, **k)
                if after:
                    note((after, pc()))
                return result
        setattr(owner, name, timed)

    around(streaming.StreamSession, "_start", "read")
    # The leader's edge, in the order a send meets it: the handler's first step (a task of
    # its own), the engine (``submit``, which hands back the future its entry answers), the
    # proposer's flush at the end of that turn and the entry encoded; then, once applied,
    # the result back in the service ("exec.end") and the reply queued.
    from sqsq.gateway import grpc_service
    from sqsq.shard import proposer, service
    around(grpc_service.QueuesService, "_stream_call", "call")
    around(engine.ShardEngine, "submit", "submit")
    around(proposer.Proposer, "_flush", "flush")
    around(proposer, "_encode", None, "encoded")
    around(service.ShardService, "send_message_batch", None, "exec.end")
    around(streaming.StreamSession, "_put", "reply.queued")
    around(frames._Connection, "_flush", None, "reply.written")
    around(statemachine.ShardMachine, "apply_entry_writes", "apply", "apply.end")
    around(statemachine.ShardMachine, "apply_entry", "apply", "apply.end")
    around(statemachine.ShardMachine, "apply_writes", "apply", "apply.end")
    around(statemachine.ShardMachine, "apply_prepared", "apply", "apply.end")
    around(statemachine.ShardMachine, "prepare", "prepare", "prepare.end")

    propose = replica.RaftReplica.propose

    def timed_propose(self: Any, data: bytes, done: Any) -> None:
        # Stamped first, with the index the entry will take: the proposal's Ready can be
        # written and sent within the call, and its stamps must come after this one.
        note(("propose", pc(), self.core.log.last_index() + 1))

        def stamped(*a: Any) -> None:
            note(("answered", pc()))
            done(*a)
        propose(self, data, stamped)
    replica.RaftReplica.propose = timed_propose  # type: ignore[method-assign]

    ready = raftnode.RaftNode.ready

    def timed_ready(self: Any) -> Any:
        rd = ready(self)
        if rd.entries:
            note(("ready(entries)", pc()))
        if any(e.data for e in rd.committed):
            note(("ready(committed)", pc()))
        return rd
    raftnode.RaftNode.ready = timed_ready  # type: ignore[method-assign]

    advance = raftnode.RaftNode.advance

    def timed_advance(self: Any, rd: Any) -> None:
        if rd.entries:
            note(("advance(entries)", pc()))
        commit = self.log.commit
        advance(self, rd)
        if self.log.commit != commit:  # a leader's own write, durable after a quorum's answer
            note(("commit moved", pc()))
    raftnode.RaftNode.advance = timed_advance  # type: ignore[method-assign]

    step = raftnode.RaftNode.step

    def timed_step(self: Any, m: Any) -> None:
        commit = self.log.commit
        step(self, m)
        if self.log.commit != commit:
            note(("commit moved", pc()))
    raftnode.RaftNode.step = timed_step  # type: ignore[method-assign]

    persist = raftstorage.RaftStorage.persist

    def timed_persist(self: Any, entries: Any, hard_state: Any) -> None:
        started = pc()
        persist(self, entries, hard_state)
        if entries:
            note(("fsync", started))
            note(("fsync.end", pc()))
    raftstorage.RaftStorage.persist = timed_persist  # type: ignore[method-assign]

    def kinds(batch: Any) -> list[str]:
        out = []
        for item in batch:
            m = item[1]
            if m.type is MsgType.APPEND and m.entries:
                out.append("append")
            elif m.type is MsgType.APPEND and not m.entries:
                out.append("append(commit)")
            elif m.type is MsgType.APPEND_RESP and not m.reject:
                out.append("ack")
            else:
                out.append("other")
        return out

    flush = peers.PeerTransport._flush

    def timed_flush(self: Any, peer: Any) -> None:
        sent = kinds(peer.queue)
        flush(self, peer)
        t = pc()
        for kind in sent:
            note((f"sent {kind}", t))
    peers.PeerTransport._flush = timed_flush  # type: ignore[method-assign]

    on_messages = replicas.Replicas.on_messages

    def timed_on_messages(self: Any, peer: str, batch: Any) -> None:
        t = pc()
        for kind, (_, m) in zip(kinds(batch), batch, strict=False):
            note((f"got {kind}", t, m.index))  # (an answer's index: the entry it matched)
        on_messages(self, peer, batch)
    replicas.Replicas.on_messages = timed_on_messages  # type: ignore[method-assign]

    # Pauses: the cyclic garbage collector's runs and the node's tick (every replica's Raft
    # tick, heartbeats, the sweep check), each as (name, start, seconds): the tail's suspects.
    import gc
    gc_started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_started[0] = pc()
        else:
            note((f"pause gc{info['generation']}", gc_started[0], pc() - gc_started[0]))
    gc.callbacks.append(on_gc)
    from sqsq.shard import host
    tick = host.PeerNetwork._tick_all

    def timed_tick(self: Any, *a: Any) -> Any:
        started = pc()
        quiet = tick(self, *a)
        note(("pause tick", started, pc() - started))
        return quiet
    host.PeerNetwork._tick_all = timed_tick  # type: ignore[method-assign]

    run_recording(argv, out, events)


# ---- the client side --------------------------------------------------------------------

async def _calls(endpoint: str, pids: list[int], sends: int, outs: list[Path]) -> None:
    from sqsq.client import AsyncClient, _frames, _stream

    cur: dict[str, float] = {}
    frame, response = _stream._frame, _stream._response

    def timed_frame(*a: Any) -> Any:
        cur.setdefault("client: frame built", pc())
        return frame(*a)

    def timed_response(reply: Any) -> Any:
        cur["client: reply read"] = pc()
        return response(reply)
    _stream._frame, _stream._response = timed_frame, timed_response
    _frames._frame = timed_frame  # (imported by name there)

    client = AsyncClient(endpoint, timeout=60.0)  # as the bench's driver
    rows, nodes = await lone_sends(client, "bench-r3stages", sends, cur,
                                   dict(zip(pids, outs, strict=True)))
    report(rows, nodes)


# What a node does for an entry once it has it: stamped before the node proposed the call's
# entry (the leader) or got its append (a follower), they are the call before's, late.
_OWN_ENTRY = frozenset({"got ack", "sent ack", "ready(entries)", "ready(committed)", "fsync",
                        "fsync.end", "advance(entries)", "commit moved"})


def node_stamps(events: list[tuple], j: int, t0: float,
                end: float) -> tuple[dict[str, float], list[tuple[str, float]], int]:
    """One node's events in a call that ran from ``t0`` to ``end`` (``events`` from cursor
    ``j``): the first time of each, the pauses, and the cursor where the next call's begin."""
    while j < len(events) and events[j][1] < t0:
        j += 1
    first: dict[str, float] = {}
    pauses: list[tuple[str, float]] = []
    index = 0  # the entry this node proposed in the call, if it did
    has_entry = False
    while j < len(events) and events[j][1] <= end:
        name, t, *more = events[j]
        j += 1
        if name.startswith("pause "):
            pauses.append((name[6:], more[0]))
            continue
        if name == "propose":
            index, has_entry = more[0], True
        elif name == "got append":
            has_entry = True
        elif name in _OWN_ENTRY and not has_entry:
            continue  # the call before's: a late answer, a follower's write of its entry
        elif name == "got ack" and more[0] < index:
            continue  # a late answer about the call before
        elif name == "got other":
            continue
        if name in first and name == "got ack":
            name = "got ack (2nd)"
        first.setdefault(name, t)
    return first, pauses, j


def report(rows: list[dict[str, float]], nodes: list[list[tuple[str, float]]]) -> None:
    """Each event's p50 time since the call began, by role, in the order they happen, and
    the p50 over the calls of the time from the row above to it (calls that had both)."""
    calls: list[dict[str, float]] = []
    call_pauses: list[list[tuple[str, float]]] = []
    cursors = [0] * len(nodes)
    for row in rows:
        t0, end = row["t0"], row["end"]
        seen: list[dict[str, float]] = []
        pauses: list[tuple[str, float]] = []
        for i, events in enumerate(nodes):
            first, paused, cursors[i] = node_stamps(events, cursors[i], t0, end)
            pauses += [(f"node{i} {name}", d) for name, d in paused]
            seen.append(first)
        leaders = [s for s in seen if "propose" in s]
        if len(leaders) != 1:
            continue
        leader = leaders[0]
        followers = sorted((s for s in seen if s is not leader),
                           key=lambda s: s.get("sent ack", float("inf")))
        call = {name: row[name] - t0 for name in ("client: frame built", "client: reply read")
                if name in row}
        call["client: end"] = end - t0
        for role, stamps in (("L", leader), *((f"F{k + 1}", f) for k, f in
                                               enumerate(followers))):
            for name, t in stamps.items():
                call[f"{role} {name}"] = t - t0
        calls.append(call)
        call_pauses.append(pauses)

    def p50(values: list[float]) -> float:
        values.sort()
        return values[len(values) // 2] * 1e3 if values else float("nan")

    names = {name for call in calls for name in call}
    order = sorted((p50([c[n] for c in calls if n in c]), n) for n in names)
    print(f"{len(calls)} lone sends; p50 ms since the call began, and p50 ms since the role's "
          f"event above (calls that had both), by role:")
    last: dict[str, str] = {}
    for at, name in order:
        role = name.split(" ", 1)[0]
        prev = last.get(role)
        step = p50([c[name] - c[prev] for c in calls if name in c and prev in c]) \
            if prev is not None else at
        last[role] = name
        n = sum(1 for c in calls if name in c)
        print(f"  {at:7.3f}  (+{step:6.3f})  {name:<28} {n}")
    tail(calls, call_pauses, [name for _, name in order], last_of=last)


def tail(calls: list[dict[str, float]], pauses: list[list[tuple[str, float]]],
         order: list[str], last_of: dict[str, str], share: float = 0.02) -> None:
    """The slowest ``share`` of the calls: for each, the step (one role's time from its
    event above to the next) furthest over its p50, and the pauses (garbage collections,
    ticks) on any node during the call; then how often each step was the culprit."""
    steps: dict[str, list[float]] = {}
    per_call: list[dict[str, float]] = []
    for call in calls:
        prev: dict[str, str] = {}
        mine: dict[str, float] = {}
        for name in order:
            role = name.split(" ", 1)[0]
            if name in call:
                if role in prev and role != "client:":  # (the client's step spans the call)
                    mine[f"{prev[role]} -> {name}"] = call[name] - call[prev[role]]
                prev[role] = name
        # The hops in and out: the client's frame to the leader's read, its reply to the
        # client's read.
        for a, b in (("client: frame built", "L read"), ("L reply.written", "client: reply read")):
            if a in call and b in call:
                mine[f"{a} -> {b}"] = call[b] - call[a]
        per_call.append(mine)
        for step, d in mine.items():
            steps.setdefault(step, []).append(d)
    med = {s: sorted(v)[len(v) // 2] for s, v in steps.items()}
    ranked = sorted(range(len(calls)), key=lambda k: calls[k]["client: end"], reverse=True)
    slow = ranked[:max(1, int(len(calls) * share))]
    culprits: dict[str, list[float]] = {}
    with_gc = with_tick = 0
    print(f"\nthe slowest {len(slow)} calls (p50 of all: "
          f"{sorted(c['client: end'] for c in calls)[len(calls) // 2] * 1e3:.3f} ms):")
    for k in slow:
        over = {s: d - med[s] for s, d in per_call[k].items()}
        worst = max(over, key=over.get) if over else "?"
        culprits.setdefault(worst, []).append(over.get(worst, 0.0))
        ps = pauses[k]
        with_gc += any(" gc" in p for p, _ in ps)
        with_tick += any(p.endswith("tick") and d > 0.001 for p, d in ps)
        long = ", ".join(f"{p} {d * 1e3:.2f}" for p, d in ps if d > 0.0003)
        print(f"  {calls[k]['client: end'] * 1e3:7.2f} ms  {worst} +{over.get(worst, 0) * 1e3:.2f}"
              f"{'  pauses: ' + long if long else ''}")
    for k in slow[:3]:
        took = calls[k]["client: end"] * 1e3
        print(f"\nevery stamp of a {took:.2f} ms call (ms since it began):")
        for name, t in sorted(calls[k].items(), key=lambda kv: kv[1]):
            print(f"  {t * 1e3:8.3f}  {name}")
        for p, d in pauses[k]:
            print(f"  pause: {p} {d * 1e3:.3f} ms")
    print("\nthe step furthest over its p50, in the slowest calls:")
    for step, extra in sorted(culprits.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(extra):4}  +{sum(extra) / len(extra) * 1e3:6.2f} ms  {step}")
    print(f"  with a garbage collection on some node: {with_gc}; with a tick over 1 ms: "
          f"{with_tick}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        _serve(sys.argv[3:], Path(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sends", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sqsq-r3stages-") as tmp:
        root = Path(tmp)
        secret = root / "cluster-secret"
        secret.write_bytes(os.urandom(32))
        ports = [(free_port(), free_port()) for _ in range(3)]
        peers = ",".join(f"127.0.0.1:{g}:{r}" for g, r in ports)
        outs = [root / f"stamps{i}.txt" for i in range(3)]
        procs = []
        try:
            for i, (gport, rport) in enumerate(ports):
                procs.append(Proc(f"sqsq-node{i}", [
                    sys.executable, "-m", "bench.r3stages", "--serve", str(outs[i]), "node",
                    "--data-dir", str(root / f"node{i}"), "--host", "127.0.0.1",
                    "--grpc-port", str(gport), "--raft-port", str(rport), "--peers", peers,
                    "--bootstrap", "--secret-file", str(secret)],
                    root / f"node{i}.log", env={"SQSQ_LOG_LEVEL": "WARNING"}))
            for proc, (gport, _) in zip(procs, ports, strict=True):
                proc.wait_port(gport)
            endpoint = ",".join(f"127.0.0.1:{g}" for g, _ in ports)
            asyncio.run(_calls(endpoint, [p.pid for p in procs], args.sends, outs))
        finally:
            for proc in procs:
                proc.stop()


if __name__ == "__main__":
    main()
