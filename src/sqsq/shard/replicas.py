"""A node's dispatcher of peer messages: what its one ``PeerTransport`` receives (Raft
messages, write sets, snapshots, refused connections), handed to the replica of each shard.
"""

from __future__ import annotations

from pathlib import Path

from sqsq.raft import Message
from sqsq.shard.replica import RaftReplica


class Replicas:
    """A node's replicas by shard, behind its one transport: what arrives is routed here."""

    def __init__(self) -> None:
        self.by_shard: dict[int, RaftReplica] = {}

    def on_messages(self, peer: str, batch: list[tuple[int, Message]]) -> None:
        """Each replica steps its messages of the batch, then acts on them once: two appends
        to one shard in a frame make one Ready, one write."""
        stepped: dict[int, RaftReplica] = {}
        for shard_id, message in batch:
            replica = self.by_shard.get(shard_id)
            if replica is not None:
                replica.step(message, settle=False)
                stepped[shard_id] = replica
        for replica in stepped.values():
            replica.settle()

    def on_refused(self, node: str) -> None:
        for replica in self.by_shard.values():
            replica.refused_by(node)

    def on_write_sets(self, peer: str,
                      sets: list[tuple[int, int, int, int, bytes | None]]) -> None:
        for shard_id, index, term, entry_check, blob in sets:
            replica = self.by_shard.get(shard_id)
            if replica is not None:
                replica.on_write_set(index, term, entry_check, blob)

    def on_snapshot(self, peer: str, shard_id: int, message: Message, path: Path) -> None:
        replica = self.by_shard.get(shard_id)
        if replica is None:
            path.unlink(missing_ok=True)
            return
        replica.on_snapshot(message, path)
