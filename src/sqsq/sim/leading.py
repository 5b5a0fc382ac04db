"""The simulated host as a shard's leader for its clients: a request is proposed as a log
entry with its command stamped (time, message ids, receipt nonces drawn from the world's
seeded generator, as the node's leader stamps them), or a read starts a ReadIndex round; a
replica that does not lead answers not-leader with the leader it knows. ``SimReplica``
answers each once its entry is applied, or the read's index is."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from sqsq.core import commands as c
from sqsq.core.entry import Entry as LogEntry
from sqsq.core.entry import encode_entry
from sqsq.sim.wire import Reply, Request

if TYPE_CHECKING:
    from sqsq.raft import RaftNode
    from sqsq.sim.machine import SimMachine
    from sqsq.sim.world import World


class Leading:
    """Mixed into ``SimReplica``, whose state it works on."""

    world: World
    id: str
    core: RaftNode | None
    machine: SimMachine
    incarnation: int
    read_seq: int
    reads: dict[bytes, Request]
    proposals: dict[int, tuple[int, Request]]

    if TYPE_CHECKING:
        def wall_ms(self) -> int: ...  # the node's own clock (``SimReplica``)

    def _on_request(self, req: Request) -> None:
        assert self.core is not None
        if not self.core.is_leader():
            self._reply(req, Reply(req.req_id, "not-leader", hint=self.core.lead))
        elif req.command is None:
            # Unique per attempt: an answer to an earlier round must not confirm this one.
            self.read_seq += 1
            ctx = b"%s:%d:%d" % (self.id.encode(), self.incarnation, self.read_seq)
            self.reads[ctx] = req
            self.core.read_index(ctx)
        else:
            self._propose(req, req.command)

    def _propose(self, req: Request | None, command: object) -> None:
        assert self.core is not None
        now = max(self.wall_ms(), self.machine.last_now_ms())
        data = encode_entry(LogEntry(now, (self._stamp(command),)))
        placed = self.core.propose(data)
        if placed is None:
            if req is not None:
                self._reply(req, Reply(req.req_id, "not-leader", hint=self.core.lead))
            return
        term, index = placed
        if req is not None:
            self.proposals[index] = (term, req)

    def _stamp(self, command: object) -> object:
        rng = self.world.rng
        if isinstance(command, c.SendMessages):
            ids = tuple(f"{rng.getrandbits(128):032x}" for _ in command.entries)
            return dataclasses.replace(command, message_ids=ids)
        if isinstance(command, c.ReceiveMessages):
            return dataclasses.replace(command, nonce=rng.getrandbits(63))
        return command

    def _reply(self, req: Request, reply: Reply) -> None:
        self.world.send_to_client(self.id, req.client, reply)
