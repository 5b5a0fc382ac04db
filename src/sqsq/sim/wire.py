"""What simulated nodes and clients send each other over the simulated network, besides the
Raft core's own ``Message``: client requests and replies, the node's heartbeat, snapshot
chunks and the leader's write sets.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqsq.core import commands as c
from sqsq.raft import Message
from sqsq.sim.machine import MachineSnapshot


@dataclass(frozen=True)
class Request:
    client: str
    req_id: int
    command: object  # a core command, or None for a read
    issued_ms: int


@dataclass(frozen=True)
class Reply:
    req_id: int
    status: str  # "ok", "read", "not-leader", "unknown"
    index: int = 0
    term: int = 0
    outcome: c.Outcome | None = None
    hint: str | None = None
    issued_ms: int = 0  # a read's: when the attempt answered was asked


@dataclass(frozen=True)
class NodePing:
    frm: str


@dataclass(frozen=True)
class SnapshotChunk:
    message: Message
    part: int
    parts: int
    data: MachineSnapshot


@dataclass(frozen=True)
class WriteSet:
    frm: str
    index: int
    term: int
    check: int
    writes: dict[bytes, bytes | None]
