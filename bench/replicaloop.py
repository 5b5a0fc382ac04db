"""What the Raft path costs a replicated send, without clients, gRPC or the engine: three
``RaftReplica``s of one shard in this process (each with its own peer transport over
loopback, Raft storage with fsync, RocksDB state), proposals of ``--messages`` 100-byte
SendMessages an entry, ``--inflight`` entries outstanding. ``--shards N``: N such groups on
the same three nodes (one transport and one batch of Raft writes per node, as a node has),
proposals spread over them round-robin. All three nodes share this process's event loop, so
a write one node does on the loop holds up the other two: read the rates with that in mind
(the CPU per entry is still what a node spends).

    python -m bench.replicaloop [--entries 3000] [--messages 1] [--inflight 1] [--shards 1]
                               [--no-fsync] [--profile]

It prints entries/s, messages/s and this process's CPU time (all three replicas, every
thread) per entry and per message, and per entry the Readys handled, disk writes, Raft
messages and transport frames (all three replicas). CPU time is what to compare on a
shared machine: the rate moves with the neighbours' load, the CPU a unit of work takes much
less.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import socket
import tempfile
import time
from pathlib import Path

from bench.raftprof import thread_cpu
from sqsq.core import commands as c
from sqsq.core.entry import Entry, encode_entry
from sqsq.core.state import ShardConfig
from sqsq.shard.peers import PeerTransport
from sqsq.shard.raftstorage import Writes
from sqsq.shard.replica import HostSettings, Proposal, RaftReplica
from sqsq.shard.replicas import Replicas
from sqsq.shard.statemachine import ShardMachine

SHARD = 1
SECRET = b"b" * 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One node: a peer transport, its batched Raft writes and a replica of each shard."""

    def __init__(self, root: Path, port: int, ports: list[int], shards: int,
                 durable: bool = True) -> None:
        self.root, self.port, self.ports, self.shards = root, port, ports, shards
        self.durable = durable
        self.replicas: dict[int, RaftReplica] = {}
        self.machines: list[ShardMachine] = []

    async def start(self) -> None:
        replicas = Replicas()
        self.transport = PeerTransport(f"127.0.0.1:{self.port}", "127.0.0.1", self.port, SECRET,
                                       replicas.on_messages, replicas.on_snapshot,
                                       snapshot_dir=self.root / "incoming",
                                       on_write_sets=replicas.on_write_sets)
        await self.transport.start()
        writes = Writes()
        for shard in range(SHARD, SHARD + self.shards):
            machine = ShardMachine(self.root / f"shard-{shard}",
                                   ShardConfig(shard_id=shard, secret=SECRET))
            self.machines.append(machine)
            replica = RaftReplica(shard, f"127.0.0.1:{self.port + shard}",
                                  self.root / f"shard-{shard}", machine, self.transport,
                                  voters=[f"127.0.0.1:{p + shard}" for p in self.ports],
                                  bootstrap=True, writes=writes,
                                  settings=HostSettings(durable=self.durable))
            replicas.by_shard[shard] = self.replicas[shard] = replica
            await replica.start()

    async def stop(self) -> None:
        for replica in self.replicas.values():
            await replica.stop()
        await self.transport.stop()
        for machine in self.machines:
            machine.close()


def _entry(n: int, messages: int) -> bytes:
    body = "x" * 100
    cmd = c.SendMessages("q", tuple(c.SendEntry(str(i), body) for i in range(messages)),
                         message_ids=tuple(f"m-{n}-{i}" for i in range(messages)))
    return encode_entry(Entry(1_000 + n, (cmd,)))


async def _propose(replica: RaftReplica, data: bytes) -> Proposal:
    fut: asyncio.Future[Proposal] = asyncio.get_running_loop().create_future()
    replica.propose(data, lambda status, _: fut.done() or fut.set_result(status))
    return await fut


async def run(root: Path, entries: int, messages: int, inflight: int,
              profile: cProfile.Profile | None, shards: int = 1,
              durable: bool = True) -> dict[str, float]:
    ports = [_free_port() for _ in range(3)]
    while len({p + s for p in ports for s in range(shards + 1)}) < 3 * (shards + 1):
        ports = [_free_port() for _ in range(3)]  # member addresses must not collide
    nodes = [Node(root / f"n{i}", p, ports, shards, durable) for i, p in enumerate(ports)]
    for n in nodes:
        await n.start()
    replicas = [r for n in nodes for r in n.replicas.values()]
    try:
        leaders = []
        for shard in range(SHARD, SHARD + shards):
            while (lead := next((n.replicas[shard] for n in nodes
                                 if n.replicas[shard].is_leader()), None)) is None:
                await asyncio.sleep(0.02)
            create = encode_entry(Entry(1_000, (c.CreateQueue("q"),)))
            while await _propose(lead, create) is not Proposal.COMMITTED:
                await asyncio.sleep(0.05)
            leaders.append(lead)
        payloads = [_entry(n, messages) for n in range(entries)]
        todo = iter(enumerate(payloads))

        async def worker() -> None:
            for n, data in todo:
                status = await _propose(leaders[n % shards], data)
                if status is not Proposal.COMMITTED:
                    raise RuntimeError(f"a proposal ended {status}")

        if profile is not None:
            profile.enable()
        counts0 = _counts(nodes)
        threads0 = thread_cpu(os.getpid())
        cpu0, t0 = time.process_time(), time.monotonic()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        targets = {lead.shard_id: lead.raftCommitIndex for lead in leaders}
        while any(r.raftLastApplied < targets[r.shard_id] for r in replicas):
            await asyncio.sleep(0.001)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        threads = thread_cpu(os.getpid())
        counts = {k: (v - counts0[k]) / entries for k, v in _counts(nodes).items()}
        if profile is not None:
            profile.disable()
    finally:
        for n in nodes:
            await n.stop()
    return {"entries_per_s": entries / wall, "msgs_per_s": entries * messages / wall,
            "cpu_us_per_entry": 1e6 * cpu / entries,
            "cpu_us_per_msg": 1e6 * cpu / (entries * messages),
            "loop_us_per_entry": 1e6 * (threads["loop"] - threads0["loop"]) / entries,
            **counts}


def _counts(nodes: list[Node]) -> dict[str, float]:
    """What the three replicas did, summed: Readys, disk writes, Raft messages, frames."""
    replicas = [r for n in nodes for r in n.replicas.values()]
    return {
        "readies": sum(r.readies for r in replicas),
        "persists": sum(r.persists for r in replicas),
        "worker_calls": sum(w.batches for w in {id(r.writes): r.writes for r in replicas}
                            .values()),

        "prepared": sum(r.prepared_used for r in replicas),
        "messages": sum(n.transport.messages_sent for n in nodes),
        "frames": sum(n.transport.frames_sent for n in nodes),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=3000)
    ap.add_argument("--messages", type=int, default=1, help="SendMessages per entry")
    ap.add_argument("--inflight", type=int, default=1, help="entries outstanding")
    ap.add_argument("--shards", type=int, default=1,
                    help="groups on the same three nodes; proposals go round-robin")
    ap.add_argument("--no-fsync", action="store_true",
                    help="no fsync per Ready (what the rest costs)")
    ap.add_argument("--profile", action="store_true", help="cProfile the event loop thread")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--sort", default="tottime", help="pstats order: tottime, cumulative")
    args = ap.parse_args()
    profile = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory(prefix="sqsq-replicaloop-") as tmp:
        r = asyncio.run(run(Path(tmp), args.entries, args.messages, args.inflight, profile,
                            args.shards, not args.no_fsync))
    print(f"{args.entries} entries of {args.messages} message(s), {args.inflight} in flight, "
          f"{args.shards} shard(s): "
          f"{r['entries_per_s']:,.0f} entries/s, {r['msgs_per_s']:,.0f} msgs/s, CPU "
          f"{r['cpu_us_per_entry']:,.0f} us/entry ({r['loop_us_per_entry']:,.0f} on the event "
          f"loop), {r['cpu_us_per_msg']:,.1f} us/msg")
    print(f"per entry, all replicas: {r['readies']:.2f} Readys, {r['persists']:.2f} disk "
          f"writes in {r['worker_calls']:.2f} worker calls, {r['messages']:.2f} Raft messages in "
          f"{r['frames']:.2f} frames; {r['prepared']:.2f} applied as prepared ahead")
    if profile is not None:
        pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
