"""sqsq's consensus core: Raft as a pure state machine (no threads, sockets, clock or disk).

``RaftNode`` takes messages, ticks and proposals and hands out a ``Ready``: what to persist,
what to send, what to apply. The shard's host (``sqsq.shard``) and the simulator
(``sqsq.sim``) drive the same core.
"""

from sqsq.raft.node import RaftNode
from sqsq.raft.types import (
    ConfChange,
    ConfOp,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Message,
    MsgType,
    RaftConfig,
    ReadState,
    Ready,
    Role,
    Safeguards,
    SnapshotMeta,
    bootstrap,
)

__all__ = [
    "ConfChange", "ConfOp", "ConfState", "Entry", "EntryKind", "HardState", "Message",
    "MsgType", "RaftConfig", "RaftNode", "ReadState", "Ready", "Role", "Safeguards",
    "SnapshotMeta", "bootstrap",
]
