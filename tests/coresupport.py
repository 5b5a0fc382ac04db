"""A deterministic driver for the pure core: a memory store, a fake clock, stamped ids."""

from __future__ import annotations

import dataclasses

from sqsq.core import commands as c
from sqsq.core import queries
from sqsq.core.machine import apply, effective_now
from sqsq.core.messages import MessageAttributeValue
from sqsq.core.state import ShardConfig, ShardState
from sqsq.core.txn import Txn
from sqsq.shard.store import MemoryStore

CONFIG = ShardConfig(shard_id=0, secret=b"test-secret")


class Core:
    """Applies commands as a leader would: stamps time and ids, commits each as one batch."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.store = MemoryStore()
        self.now_ms = now_ms
        self._ids = 0
        self.effects: list = []

    def advance(self, seconds: float) -> None:
        self.now_ms += int(seconds * 1000)

    def run(self, cmd: c.Command) -> c.Result:
        if isinstance(cmd, c.SendMessages):
            ids = []
            for _ in cmd.entries:
                self._ids += 1
                ids.append(f"00000000-0000-4000-8000-{self._ids:012d}")
            cmd = c.SendMessages(cmd.queue, cmd.entries, cmd.request_id, tuple(ids))
        if isinstance(cmd, c.ReceiveMessages):
            self._ids += 1
            cmd = dataclasses.replace(cmd, nonce=self._ids * 7919)
        txn = Txn(self.store)
        out = apply(txn, CONFIG, cmd, self.now_ms)
        self.store.write(txn.writes(), sync=False)
        self.effects.extend(out.effects)
        return out.result

    # ---- conveniences in SQS's words ----
    def create(self, name: str, **attrs: object) -> c.Result:
        return self.run(c.CreateQueue(name, tuple((k, str(v)) for k, v in attrs.items())))

    def send(self, queue: str, body: str, **kw: object) -> c.Result:
        attrs = kw.pop("message_attributes", {})
        entry = c.SendEntry("0", body, message_attributes=tuple(
            (k, v if isinstance(v, MessageAttributeValue) else MessageAttributeValue("String", v))
            for k, v in attrs.items()), **kw)
        return self.run(c.SendMessages(queue, (entry,)))

    def receive(self, queue: str, n: int = 1, timeout: int | None = None) -> list:
        res = self.run(c.ReceiveMessages(queue, n, timeout))
        assert isinstance(res, c.Received), res
        return list(res.messages)

    def delete(self, queue: str, handle: str) -> c.Result:
        return self.run(c.DeleteMessages(queue, (("0", handle),)))

    def change(self, queue: str, handle: str, timeout: int) -> c.Result:
        return self.run(c.ChangeVisibilities(queue, (("0", handle, timeout),)))

    def state(self) -> ShardState:
        """A read-only view of the shard as it is now."""
        return ShardState(Txn(self.store), CONFIG)

    def attrs(self, queue: str, *names: str) -> dict[str, str]:
        txn = Txn(self.store)
        out = queries.queue_attributes(ShardState(txn, CONFIG), queue, list(names) or ["All"],
                                       effective_now(txn, self.now_ms))
        assert isinstance(out, dict), out
        return out

    def depth(self, queue: str) -> tuple[int, int, int]:
        a = self.attrs(queue)
        return (int(a["ApproximateNumberOfMessages"]),
                int(a["ApproximateNumberOfMessagesNotVisible"]),
                int(a["ApproximateNumberOfMessagesDelayed"]))
