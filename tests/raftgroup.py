"""A few RaftNodes wired together by hand: every Ready is persisted in memory, its messages
routed (or dropped, by the links a test cuts), its committed entries recorded. Tests script
the interaction step by step, as etcd's raft interaction tests do."""

from __future__ import annotations

import random
from collections.abc import Iterable

from sqsq.raft import (
    ConfState,
    Entry,
    EntryKind,
    Message,
    RaftConfig,
    RaftNode,
    Safeguards,
    bootstrap,
)


class Group:
    def __init__(self, ids: Iterable[str] = ("a", "b", "c"), *, learners: Iterable[str] = (),
                 config: RaftConfig | None = None, safeguards: Safeguards | None = None,
                 seed: int = 1) -> None:
        ids = list(ids)
        learners = list(learners)
        self.conf = ConfState(frozenset(ids), frozenset(learners))
        self.config = config or RaftConfig(election_ticks=10, heartbeat_ticks=1)
        self.safeguards = safeguards or Safeguards()
        self.rng = random.Random(seed)
        self.nodes: dict[str, RaftNode] = {}
        self.applied: dict[str, list[Entry]] = {}
        self.cut: set[tuple[str, str]] = set()
        self.inbox: list[Message] = []
        for n in [*ids, *learners]:
            self.add(n)

    def add(self, node_id: str) -> RaftNode:
        """A first member of the group (its membership bootstrapped in the log)."""
        hs, snap, entries = bootstrap(self.conf.voters, self.conf.learners)
        node = RaftNode(node_id, hard_state=hs, snapshot=snap, entries=entries,
                        rng=random.Random(self.rng.getrandbits(32)), config=self.config,
                        safeguards=self.safeguards)
        self.nodes[node_id] = node
        self.applied[node_id] = []
        return node

    def isolate(self, node_id: str) -> None:
        for other in self.nodes:
            if other != node_id:
                self.cut.update({(node_id, other), (other, node_id)})

    def heal(self) -> None:
        self.cut.clear()

    def flush(self, rounds: int = 50) -> None:
        """Process every Ready and deliver every message until nothing moves."""
        for _ in range(rounds):
            moved = False
            for node_id, node in self.nodes.items():
                while node.has_ready():
                    rd = node.ready()
                    self.inbox.extend(m for m in rd.messages if (m.frm, m.to) not in self.cut)
                    self.applied[node_id].extend(rd.committed)
                    node.advance(rd)
                    moved = True
            inbox, self.inbox = self.inbox, []
            for m in inbox:
                if m.to in self.nodes:
                    self.nodes[m.to].step(m)
                    moved = True
            if not moved:
                return

    def tick(self, n: int = 1, only: Iterable[str] | None = None) -> None:
        for _ in range(n):
            for node_id in list(only or self.nodes):
                self.nodes[node_id].tick()
            self.flush()

    def elect(self, node_id: str) -> RaftNode:
        """Make ``node_id`` lead: by a leadership transfer if some node leads, else by
        letting its election timeout run out; then let the group settle."""
        node = self.nodes[node_id]
        current = self.leader()
        if current is not None and current is not node:
            assert current.transfer_leadership(node_id)
            self.flush()
        for _ in range(node.timeout + 1):
            if node.is_leader():
                break
            node.tick()
            if node.role.name != "FOLLOWER":
                break
        self.flush()
        assert node.is_leader(), f"{node_id} did not win: {node.role}"
        return node

    def leader(self) -> RaftNode | None:
        leaders = [n for n in self.nodes.values() if n.is_leader()]
        return max(leaders, key=lambda n: n.term) if leaders else None

    def payloads(self, node_id: str) -> list[bytes]:
        return [e.data for e in self.applied[node_id] if e.data and e.kind is EntryKind.NORMAL]
