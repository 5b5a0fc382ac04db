"""Opening the shard replicas a process hosts: store, Raft member and engine, per shard.

A member of a group is named by its Raft address; clients and gateways reach it by its gRPC
address. ``Peer`` pairs the two: a node listens for shard ``s``'s Raft traffic on its Raft
base port + ``s``, so one peer list describes every group the nodes share.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqsq.admincred import check_length
from sqsq.core.state import ShardConfig
from sqsq.shard.clock import Ms, wall_clock_ms
from sqsq.shard.engine import ShardEngine
from sqsq.shard.journal import fsync_path
from sqsq.shard.raft import RaftSettings, ShardReplica
from sqsq.shard.statemachine import ShardMachine


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


@dataclass
class ReplicaOptions:
    bootstrap: bool = False  # a new replica directory forms a new group (else: it rejoins)
    durable: bool = True  # fsync the Raft journal (off: benchmarks only)
    memory: bool = False  # state in memory (the journal is still on disk): tests
    compaction_min_entries: int = 5000
    election_timeout_s: tuple[float, float] = (0.4, 1.2)
    on_fatal: Callable[[BaseException], None] | None = None
    password: str | None = None
    # the address the Raft port listens on (the process's --host); None: its own Raft
    # address's host
    bind_host: str | None = None
    # Raft address -> gRPC address of a member (default: from the peers given; a cluster
    # node looks members up in the partition map, which knows members added later)
    grpc_of: Callable[[str | None], str | None] | None = None
    wall_clock_ms: Ms = wall_clock_ms  # a test may give a clock it can step


def open_replica(
    shard_id: int, directory: Path, config: ShardConfig, me: Peer, peers: list[Peer],
    options: ReplicaOptions,
) -> ShardEngine:
    """One shard replica: its state machine over its store, its Raft member, its engine."""
    machine = ShardMachine(directory, config, memory=options.memory)
    settings = RaftSettings(
        self_address=me.raft(shard_id), peers=[p.raft(shard_id) for p in peers],
        directory=directory, bootstrap=options.bootstrap, durable=options.durable,
        election_timeout_s=options.election_timeout_s,
        compaction_min_entries=options.compaction_min_entries, on_fatal=options.on_fatal,
        password=options.password,
        bind_address=None if options.bind_host is None
        else f"{options.bind_host}:{me.raft_port + shard_id}")
    replica = ShardReplica(settings, machine)
    by_raft = {p.raft(shard_id): p.grpc for p in peers}
    return ShardEngine(machine, replica, clock_ms=options.wall_clock_ms,
                       leader_hint=options.grpc_of or (lambda raft: by_raft.get(raft or "")))
