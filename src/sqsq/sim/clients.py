"""Simulated SQS clients: send, receive, delete and change visibility on a standard and a FIFO
queue, and read, the way the SDK does it: to the node they think leads, following NotLeader
hints, retrying an unknown outcome with the same request id (a send's idempotency key).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqsq.core import commands as c
from sqsq.sim.wire import Reply, Request

if TYPE_CHECKING:
    from sqsq.sim.world import World

STANDARD, FIFO = "q", "f.fifo"
SETUP = (c.CreateQueue(STANDARD), c.CreateQueue(FIFO, (("FifoQueue", "true"),)))
RETRY_MS = 400  # no answer within this: try again (elsewhere)


class SimClient:
    def __init__(self, world: World, name: str, setup: bool = False) -> None:
        self.world = world
        self.name = name
        self.rng = world.rng
        self.leader = world.node_ids[0]
        self.handles: list[tuple[str, str]] = []  # (queue, receipt handle)
        self.next_id = 0
        self.current: Request | None = None
        self.attempt = 0
        self.setup = list(SETUP) if setup else []
        self.done = False
        self.stopped = False

    def start(self) -> None:
        self.world.after(self.rng.randint(1, 50), self._next, 0)

    def _next(self, _: int) -> None:
        if self.stopped:
            return
        if self.setup:
            command: object = self.setup[0]
        elif not self.world.ready:
            self.world.after(50, self._next, 0)
            return
        else:
            command = self._choose()
        self.next_id += 1
        self.current = Request(self.name, self.next_id, command, self.world.now_ms)
        self._send()

    def _send(self) -> None:
        req = self.current
        assert req is not None
        self.attempt += 1
        attempt = self.attempt
        # A retry is a new request in time (a read asked again is asked later).
        if req.command is None:
            req = Request(req.client, req.req_id, None, self.world.now_ms)
            self.current = req
        self.world.send_to_node(self.name, self.leader, req)
        self.world.after(RETRY_MS, self._timeout, attempt)

    def _timeout(self, attempt: int) -> None:
        if attempt == self.attempt and self.current is not None:
            self.leader = self.rng.choice(self.world.node_ids)
            self._send()

    def on_reply(self, reply: Reply) -> None:
        req = self.current
        if req is None or reply.req_id != req.req_id:
            return  # an answer to an attempt already given up on
        if reply.status == "not-leader":
            self.leader = reply.hint or self.rng.choice(self.world.node_ids)
            self.attempt += 1  # the pending timeout is void: resend after a short pause
            self.world.after(self.rng.randint(5, 60), self._resend, self.attempt)
            return
        if reply.status == "unknown":
            self.attempt += 1
            self.world.after(self.rng.randint(5, 60), self._resend, self.attempt)
            return
        self.current = None
        if reply.status == "read":
            self.world.checker.on_read(reply.issued_ms, reply.index)
        else:
            assert reply.outcome is not None
            self.world.checker.on_ack(self.world.now_ms, reply.index, reply.term, reply.outcome)
            self._learn(req.command, reply.outcome)
        self.world.after(self.rng.randint(*self.world.scenario.think_ms), self._next, 0)

    def _resend(self, attempt: int) -> None:
        if attempt == self.attempt and self.current is not None:
            self._send()

    def _learn(self, command: object, outcome: c.Outcome) -> None:
        if self.setup and command == self.setup[0]:
            self.setup.pop(0)
            if not self.setup:
                self.world.ready = True
        res = outcome.result
        if isinstance(res, c.Received):
            queue = command.queue  # type: ignore[attr-defined]
            self.handles.extend((queue, m.receipt_handle) for m in res.messages)
            del self.handles[:-20]

    def _choose(self) -> object:
        rng = self.rng
        roll = rng.random()
        queue = FIFO if rng.random() < 0.4 else STANDARD
        if roll < 0.4:
            n = rng.randint(1, 3)
            body_size = self.world.scenario.body_bytes(rng)
            entries = tuple(
                c.SendEntry(str(i), f"{self.name}-{self.next_id}-{i}-".ljust(body_size, "x"),
                            message_group_id=f"g{rng.randint(0, 2)}" if queue == FIFO else None,
                            message_deduplication_id=(f"{self.name}-{self.next_id}-{i}"
                                                      if queue == FIFO else None))
                for i in range(n))
            return c.SendMessages(queue, entries, request_id=f"{self.name}-{self.next_id}")
        if roll < 0.65:
            return c.ReceiveMessages(queue, rng.randint(1, 5), rng.choice([1, 2, 5, 30]))
        if roll < 0.85 and self.handles:
            q, h = self.handles.pop(rng.randrange(len(self.handles)))
            return c.DeleteMessages(q, (("0", h),))
        if roll < 0.92 and self.handles:
            q, h = rng.choice(self.handles)
            return c.ChangeVisibilities(q, (("0", h, rng.choice([0, 1, 10])),))
        return None  # a read
