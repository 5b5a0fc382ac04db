"""Opening the shard replicas a process hosts: store, Raft member and engine, per shard, and
the one peer transport they share.

A member of a group is named by its Raft address; clients and gateways reach it by its gRPC
address. ``Peer`` pairs the two: shard ``s``'s member on a node is named by the node's Raft
port + ``s``, so one peer list describes every group the nodes share; the node itself listens
on its Raft port alone, one connection per pair of nodes carrying every shard's traffic
(``PeerNetwork``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqsq.admincred import check_length
from sqsq.core.state import ShardConfig
from sqsq.shard.clock import Ms, wall_clock_ms
from sqsq.shard.durable import fsync_path
from sqsq.shard.engine import ShardEngine
from sqsq.shard.peers import PeerTransport
from sqsq.shard.raftstorage import Writes
from sqsq.shard.replica import HostSettings, RaftReplica
from sqsq.shard.replicas import Replicas
from sqsq.shard.statemachine import ShardMachine
from sqsq.shard.sweeps import SweepScheduler

TICK_S = 0.05  # the Raft clock: elections and heartbeats count in these
PING_EVERY_TICKS = 4  # the node's heartbeat to its peers: 0.2 s
SWEEP_EVERY_TICKS = 2  # every engine's sweep check (``SweepScheduler``): 0.1 s
QUIESCE_AFTER_TICKS = 40  # a group with nothing to do for 2 s goes quiet
# The nodes the heartbeat goes to are worked out again at least this often (1 s) even with
# no Raft message in between; well within QUIESCE_AFTER_TICKS, so a node that joins a group
# is pinged before the group can go quiet.
NODES_EVERY_TICKS = 20
# While every replica a node hosts is quiet, its clock runs at the heartbeat's pace: a quiet
# replica is not ticked (unless a node it watches fell silent), so the Raft ticks in between
# would only wake the process. The sweep checks go at that pace too (a timer due on a quiet
# node is seen up to 0.1 s later). The first Ready of a replica that wakes brings the clock
# back to TICK_S (``hurry``).
QUIET_TICK_S = TICK_S * PING_EVERY_TICKS


@dataclass(frozen=True)
class Peer:
    host: str
    grpc_port: int
    raft_port: int  # shard s: raft_port + s

    @property
    def grpc(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def raft(self, shard_id: int) -> str:
        return f"{self.host}:{self.raft_port + shard_id}"

    @classmethod
    def of(cls, node: Any) -> Peer:
        """The peer a node record (``grpc_address``, ``raft_address``) describes."""
        host, _, grpc_port = node.grpc_address.rpartition(":")
        _, _, raft_port = node.raft_address.rpartition(":")
        return cls(host, int(grpc_port), int(raft_port))


def parse_peers(text: str) -> list[Peer]:
    """``host:grpc_port:raft_port`` separated by commas."""
    peers = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        parts = item.rsplit(":", 2)
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            raise ValueError(f"a peer is host:grpc_port:raft_port, not {item!r}")
        peers.append(Peer(parts[0], int(parts[1]), int(parts[2])))
    if len({p.grpc for p in peers}) != len(peers):
        raise ValueError("peers must differ")
    return peers


def load_secret(path: Path) -> bytes:
    """The receipt-handle key at ``path``, made (32 random bytes, fsynced) if missing; one
    shorter than 32 bytes is refused (an empty file would sign every handle with no key)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(path.parent, directory=True)  # the rename itself must survive a crash
    return check_length(path.read_bytes(), path, "receipt-handle secret")


class PeerNetwork:
    """A process's Raft peer transport, shared by all its replicas: it listens on
    ``bind_host`` at the node's Raft port, and peers prove the key derived from the cluster
    secret before anything they send is read."""

    def __init__(self, me: Peer, bind_host: str, key: bytes, directory: Path) -> None:
        self.replicas = Replicas()
        self.transport = PeerTransport(
            f"{me.host}:{me.raft_port}", bind_host, me.raft_port, key,
            self._on_messages, self.replicas.on_snapshot,
            snapshot_dir=directory / "incoming-snapshots",
            on_write_sets=self.replicas.on_write_sets, on_refused=self.replicas.on_refused)
        self.writes = Writes()  # every replica's Raft writes, batched per loop turn
        self._clock: asyncio.TimerHandle | None = None
        self.sweeps = SweepScheduler(TICK_S * SWEEP_EVERY_TICKS, own_timer=False)
        self._ticks = 0
        self._ticked_at = 0.0  # the loop's time at the last tick
        self.quiet = False  # the clock runs at QUIET_TICK_S: every replica here is quiet
        # whom the node's heartbeat goes to, and how long a node may stay silent; worked
        # out again when Raft messages arrived (a membership changes only through them),
        # a replica was added, or at least every NODES_EVERY_TICKS
        self._nodes: set[tuple[str, tuple[str, int]]] = set()
        self._liveness_s = 0.0
        self._nodes_of: tuple[int, int] = (-1, -1)  # (replicas, tick) they were worked out at
        self._traffic = False
        self._beats: list[asyncio.Future[None]] = []  # waiting for the next heartbeat round

    async def start(self) -> int:
        port = await self.transport.start()
        self._ticked_at = asyncio.get_running_loop().time()
        self._clock = asyncio.get_running_loop().call_later(TICK_S, self._tick)
        return port

    async def stop(self) -> None:
        if self._clock is not None:
            self._clock.cancel()
            self._clock = None
        await self.transport.stop()

    async def beat(self) -> None:
        """Wait for the clock's next heartbeat round (every PING_EVERY_TICKS ticks, 0.2 s,
        at either pace): periodic work done then costs the process no wake-up of its own."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._beats.append(waiter)
        await waiter

    def add(self, replica: RaftReplica) -> None:
        """Tick ``replica`` with the others and route what arrives for its shard to it."""
        self.replicas.by_shard[replica.shard_id] = replica
        replica.on_active = self.hurry

    def heard(self, node: str) -> float | None:
        return self.transport.heard.get(node)

    def _on_messages(self, peer: str, batch: list) -> None:
        if batch:  # an empty one is a node's ping
            self._traffic = True
        self.replicas.on_messages(peer, batch)

    def _tick(self) -> None:
        """One timer for the process (a callback, not a task: no future and no task step
        per tick): every replica's Raft tick, the node's heartbeat to every node it shares
        a group with (a quiet group's liveness), and every engine's sweep check."""
        quiet = False
        now = asyncio.get_running_loop().time()
        # the sweep and ping schedule counts the ticks' time, not their number: a tick after
        # a quiet one (hurried or not) comes more than one TICK_S after it
        elapsed = max(1, round((now - self._ticked_at) / TICK_S))
        self._ticked_at = now
        try:
            quiet = self._tick_all(elapsed)
        finally:
            if self._clock is not None:
                self.quiet = quiet
                self._clock = asyncio.get_running_loop().call_later(
                    QUIET_TICK_S if quiet else TICK_S, self._tick)

    @property
    def tick_s(self) -> float:
        """The clock's pace now."""
        return QUIET_TICK_S if self.quiet else TICK_S

    def hurry(self) -> None:
        """A replica has work (its Ready loop turned): the clock back to Raft's pace. The
        next tick still comes a whole TICK_S from now, never sooner: a tick counts time."""
        if self.quiet and self._clock is not None:
            self.quiet = False
            self._clock.cancel()
            self._clock = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def _tick_all(self, elapsed: int) -> bool:
        """One tick, ``elapsed`` of TICK_S since the last; whether every replica is quiet
        after it."""
        # A quiet replica's tick only looks for a silent node. While every node this one
        # shares a group with was heard from within the liveness bound, none would wake:
        # the quiet ones are passed over (most of an idle node's replicas).
        nodes = self._nodes
        all_heard = bool(nodes) and self._all_heard(nodes, self._liveness_s)
        quiet = True
        for replica in list(self.replicas.by_shard.values()):
            core = replica.core
            if all_heard and core is not None and core.quiesced:
                continue
            replica.tick()
            if core is None or not core.quiesced:
                quiet = False
        last = self._ticks
        self._ticks = n = last + elapsed
        if n // SWEEP_EVERY_TICKS != last // SWEEP_EVERY_TICKS:
            self.sweeps.check_all()
        if n // PING_EVERY_TICKS != last // PING_EVERY_TICKS:
            replicas = self.replicas.by_shard
            if self._traffic or self._nodes_of[0] != len(replicas) or \
                    n - self._nodes_of[1] >= NODES_EVERY_TICKS:
                self._traffic = False
                self._nodes_of = (len(replicas), n)
                self._nodes = nodes = {p for r in replicas.values() for p in r.nodes()}
                self._liveness_s = min((r.settings.liveness_s for r in replicas.values()),
                                       default=0.0)
            for node, address in nodes:
                self.transport.ping(node, address)
            beats, self._beats = self._beats, []
            for waiter in beats:
                if not waiter.done():  # (one cancelled meanwhile)
                    waiter.set_result(None)
        return quiet

    def _all_heard(self, nodes: set[tuple[str, tuple[str, int]]], liveness_s: float) -> bool:
        heard, now = self.transport.heard, time.monotonic()
        for node, _ in nodes:
            at = heard.get(node)
            if at is None or now - at > liveness_s:
                return False
        return True


@dataclass
class ReplicaOptions:
    bootstrap: bool = False  # a new replica directory forms a new group (else: it rejoins)
    durable: bool = True  # fsync the Raft journal (off: benchmarks only)
    memory: bool = False  # state in memory (the journal is still on disk): tests
    compaction_min_entries: int = 5000
    election_timeout_s: tuple[float, float] = (0.4, 1.2)
    on_fatal: Callable[[BaseException], None] | None = None
    # Raft address -> gRPC address of a member (default: from the peers given; a cluster
    # node looks members up in the partition map, which knows members added later)
    grpc_of: Callable[[str | None], str | None] | None = None
    wall_clock_ms: Ms = wall_clock_ms  # a test may give a clock it can step


def open_replica(
    shard_id: int, directory: Path, config: ShardConfig, me: Peer, peers: list[Peer],
    options: ReplicaOptions, network: PeerNetwork | None = None,
) -> ShardEngine:
    """One shard replica: its state machine over its store, its Raft member, its engine.
    ``network`` may be None for a group of one (it never sends)."""
    machine = ShardMachine(directory, config, memory=options.memory)
    lo, _ = options.election_timeout_s
    settings = HostSettings(
        tick_s=TICK_S, election_ticks=max(4, round(lo / TICK_S)), durable=options.durable,
        compaction_entries=options.compaction_min_entries,
        keep_entries=max(1, options.compaction_min_entries // 10),
        quiesce_after_ticks=QUIESCE_AFTER_TICKS)
    replica = RaftReplica(
        shard_id, me.raft(shard_id), directory, machine,
        network.transport if network is not None else None,
        voters=[p.raft(shard_id) for p in peers], bootstrap=options.bootstrap,
        settings=settings, on_fatal=options.on_fatal,
        heard=network.heard if network is not None else None,
        ticked_by_host=network is not None,
        writes=network.writes if network is not None else None)
    if network is not None:
        network.add(replica)
    by_raft = {p.raft(shard_id): p.grpc for p in peers}
    return ShardEngine(machine, replica, clock_ms=options.wall_clock_ms,
                       leader_hint=options.grpc_of or (lambda raft: by_raft.get(raft or "")),
                       sweeps=network.sweeps if network is not None else None)
