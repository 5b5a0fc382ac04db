"""Direct routing's bookkeeping: where a cluster's queues live, as its gateway says
(``DescribeQueueRoute``), and how one message call splits over a queue's partitions. The
calls themselves are made by ``sqsq.client._routed``.

A client pointed at a cluster's gateway sends its message calls (send, receive, delete,
change visibility and their batches) straight to the leader of the shard each is for, over
the stream or frame connection it keeps to that node; queue calls stay on the gateway. A FIFO
group's sends go to the partition its hash names and a receipt handle to the shard it names,
as the gateway routes them (``sqsq.wire``). A standard queue's sends go where the route says
the gateway's own go: its home partition, or while that partition's leader is busy, a few
from there on, a burst at a time (``sqsq.wire.SendSpread``: calls made close together go to
one partition, whose shard commits them in one Raft entry); a receive looks first where the
last one found messages (``sqsq.wire.ReceiveSpread``). Nothing about delivery is decided here: the
shard answers each call as it would the gateway's.

What the client holds is a hint, refreshed when it is old (``ROUTE_TTL_S``: a dead-letter
queue can gain partitions; ``SEND_WIDTH_TTL_S`` for a standard queue of several partitions,
whose sends widen while its home partition's leader is busy), when a node answers that it
does not know the queue, and when no replica of a shard answers; a NotLeader answer naming
the leader is followed at once. A node that cannot be reached is left alone for
``NODE_DOWN_S`` and its calls go through the gateway meanwhile. Env ``SQSQ_DIRECT=0`` (or
``direct=False``) turns direct routing off.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import (
    REGION_METADATA_KEY,
    SHARD_METADATA_KEY,
    ReceiveSpread,
    SendSpread,
    group_partition,
    send_partition,
    shard_of_receipt_handle,
)

ENV_DIRECT = "SQSQ_DIRECT"
ROUTE_TTL_S = 5.0  # a queue's route is asked for again after this long
# ... and a standard queue's of several partitions after this long: its send width follows its
# home leader's load (a node says it is busy within a second); learnt 5 s late, most of a burst
# of load went to one leader. (The gateway answers from its map in memory.)
SEND_WIDTH_TTL_S = 1.0
NO_ROUTE_S = 1.0  # a queue the gateway could not route (unknown, or the gateway away)
NODE_DOWN_S = 5.0  # a node that could not be reached is tried again after this long
MAX_ROUTES = 1024  # queues whose routes a client keeps (the oldest go first)
# The calls that go to a shard's leader; every other one goes through the gateway.
MESSAGE_CALLS = frozenset({
    "SendMessage", "SendMessageBatch", "ReceiveMessage", "DeleteMessage",
    "DeleteMessageBatch", "ChangeMessageVisibility", "ChangeMessageVisibilityBatch"})


def enabled(option: bool | None) -> bool:
    """Direct routing on (the default), unless ``option`` or env ``SQSQ_DIRECT`` says off."""
    if option is not None:
        return option
    return os.environ.get(ENV_DIRECT, "1").strip().lower() not in ("0", "false", "no", "off")


class Fallback(Exception):
    """The call cannot go direct (and none of it ran there): send it through the gateway.
    ``counted``: whether routing's stats count it (not a long poll left to the gateway by
    design); ``request``: what to send there in place of the call's own request (a long
    poll after the look at each partition: what that look left of its wait)."""

    def __init__(self, counted: bool = True, request: Any = None) -> None:
        super().__init__(counted)
        self.counted = counted
        self.request = request


@dataclass(frozen=True)
class QueueRoute:
    """One queue's route as the gateway gave it."""

    name: str
    region: str
    fifo: bool
    shards: tuple[int, ...]  # partition i's shard
    version: int
    expires: float
    send_home: int = 0  # a standard queue's sends: ``send_width`` partitions from this one
    send_width: int = 0  # (0: all of them)

    @classmethod
    def read(cls, reply: pb.QueueRoute, now: float) -> QueueRoute:
        shards = tuple(p.shard for p in reply.partitions)
        ttl = ROUTE_TTL_S if reply.fifo or len(shards) < 2 else SEND_WIDTH_TTL_S
        return cls(reply.queue_name, reply.region, reply.fifo, shards, reply.version,
                   now + ttl, reply.send_home, reply.send_width)

    def metadata(self, shard: int) -> tuple[tuple[str, str], ...]:
        return ((SHARD_METADATA_KEY, str(shard)), (REGION_METADATA_KEY, self.region))


@dataclass
class Stats:
    """What a client's direct routing did: calls answered by a shard leader directly, calls
    (or parts of calls) sent through the gateway instead, and routes asked for."""

    direct: int = 0
    fallbacks: int = 0
    refreshes: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"direct": self.direct, "fallbacks": self.fallbacks,
                "refreshes": self.refreshes}


@dataclass
class Table:
    """Routes by (queue as the caller names it, region), at most ``MAX_ROUTES``; each shard's
    nodes (the one that answered last first), and nodes out of reach until a time. Safe to
    share between threads (each change is one dict operation, or made under ``lock``)."""

    clock: Callable[[], float]
    routes: dict[tuple[str, str | None], QueueRoute | float] = field(default_factory=dict)
    nodes: dict[int, list[str]] = field(default_factory=dict)
    terms: dict[int, int] = field(default_factory=dict)  # the newest leader term seen
    down: dict[str, float] = field(default_factory=dict)
    off: bool = False  # the server routes nothing (one shard group, or an older server)
    stats: Stats = field(default_factory=Stats)
    sends: SendSpread = field(default_factory=SendSpread)
    receives: ReceiveSpread = field(default_factory=ReceiveSpread)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def route(self, queue: str, region: str | None) -> QueueRoute | None | bool:
        """The queue's route; None: none known, or an old one (ask); False: go through the
        gateway for now."""
        found = self.routes.get((queue, region))
        if found is None:
            return None
        if isinstance(found, float):
            return False if self.clock() < found else None
        return found if self.clock() < found.expires else None

    def _keep(self, key: tuple[str, str | None], value: QueueRoute | float) -> None:
        with self.lock:
            routes = self.routes
            routes.pop(key, None)  # to the end: the oldest stay first
            while len(routes) >= MAX_ROUTES:
                routes.pop(next(iter(routes)), None)
            routes[key] = value

    def learn(self, queue: str, region: str | None, reply: pb.QueueRoute) -> QueueRoute:
        route = QueueRoute.read(reply, self.clock())
        self._keep((queue, region), route)
        self.stats.refreshes += 1
        for p in reply.partitions:
            known = self.nodes.get(p.shard)
            if p.leader and p.leader_term > self.terms.get(p.shard, 0):
                self.terms[p.shard] = p.leader_term
                first = [p.leader]  # newly elected: the node that answered last may be gone
            else:
                # The node that answered last stays first while the gateway still lists it.
                first = [known[0]] if known and known[0] in p.nodes else []
            self.nodes[p.shard] = list(dict.fromkeys([*first, *p.nodes]))
        return route

    def unroutable(self, queue: str, region: str | None) -> None:
        self._keep((queue, region), self.clock() + NO_ROUTE_S)

    def forget(self, queue: str, region: str | None) -> None:
        self.routes.pop((queue, region), None)

    def targets(self, shard: int) -> list[str]:
        """The shard's nodes in reach, the likeliest leader first."""
        return [a for a in self.nodes.get(shard, ()) if not self.is_down(a)]

    def answered(self, shard: int, address: str) -> None:
        known = self.nodes.get(shard, [])
        if not known or known[0] != address:
            self.nodes[shard] = [address, *(a for a in known if a != address)]

    def is_down(self, address: str) -> bool:
        return self.down.get(address, 0.0) > self.clock()

    def unreachable(self, address: str) -> None:
        self.down[address] = self.clock() + NODE_DOWN_S


# ---- how one call splits over a queue's partitions ----------------------------------------

Part = tuple[int, Any]  # (shard, the request for it)


def _copy(request: Any, **changes: Any) -> Any:
    out = type(request)()
    out.CopyFrom(request)
    for name, value in changes.items():
        setattr(out, name, value)
    return out


def _by_handle(route: QueueRoute, request: Any) -> list[Part]:
    """A delete or visibility batch: each entry to the shard its handle names (one naming
    no partition of the queue goes to the first, which refuses it as SQS would)."""
    shards = route.shards
    handles = [entry.receipt_handle for entry in request.entries]
    # Most batches are one receive's messages: handles that begin alike (version and shard,
    # ``shard_of_receipt_handle``) name one shard, and only the first is read.
    first = shard_of_receipt_handle(handles[0]) if handles else None
    if first is not None:
        head = handles[0][:4]
        for h in handles:
            if h[:4] != head:
                break
        else:
            return [(first if first in shards else shards[0], request)]
    of = [shard_of_receipt_handle(h) for h in handles]
    groups: dict[int, list] = {}
    for shard, entry in zip(of, request.entries, strict=True):
        groups.setdefault(shard if shard in shards else shards[0], []).append(entry)
    if len(groups) <= 1:
        return [(next(iter(groups), shards[0]), request)]
    parts = []
    for shard, entries in groups.items():
        part = _copy(request)
        del part.entries[:]
        part.entries.extend(entries)
        parts.append((shard, part))
    return parts


def parts(method: str, request: Any, route: QueueRoute, sends: SendSpread) -> list[Part]:
    """The shards ``request`` goes to, each with its part, as the gateway splits it
    (``sqsq.gateway.cluster``), except that a standard queue's send takes the partition of
    ``sends``'s turn. A receive from several partitions is the caller's to fan out (not
    here)."""
    shards = route.shards
    n = len(shards)
    if n == 1:
        return [(shards[0], request)]
    if method in ("SendMessage", "SendMessageBatch") and not route.fifo:
        if route.send_width == 1:  # (the home partition: no turn to take)
            return [(shards[route.send_home % n], request)]
        p = send_partition(sends.turn(), route.send_home, route.send_width, n)
        return [(shards[p], request)]
    if method == "SendMessage":  # without a group: partition 0, whose shard refuses it
        group = request.message_group_id
        return [(shards[group_partition(group, n) if group else 0], request)]
    if method == "SendMessageBatch":
        by_partition: dict[int, list] = {}
        for entry in request.entries:
            group = entry.message_group_id
            by_partition.setdefault(group_partition(group, n) if group else 0, []).append(entry)
        if len(by_partition) <= 1:
            return [(shards[next(iter(by_partition), 0)], request)]
        out = []
        for p, entries in sorted(by_partition.items()):
            part = _copy(request, request_id=f"{request.request_id}/{p}")
            del part.entries[:]
            part.entries.extend(entries)
            out.append((shards[p], part))
        return out
    if method in ("DeleteMessage", "ChangeMessageVisibility"):
        shard = shard_of_receipt_handle(request.receipt_handle)
        return [(shard if shard in shards else shards[0], request)]
    return _by_handle(route, request)


def merged(method: str, replies: list[Any]) -> Any:
    """One reply from the parts' replies (batches: their entries together)."""
    if len(replies) == 1:
        return replies[0]
    if method == "SendMessageBatch":
        out = pb.SendMessageBatchResponse()
    else:
        out = pb.BatchResponse()
    for reply in replies:
        out.successful.extend(reply.successful)
        out.failed.extend(reply.failed)
    return out


def quick_receive(request: pb.ReceiveMessageRequest) -> pb.ReceiveMessageRequest:
    """The receive as a look at one partition now (the sweep before a long poll)."""
    return _copy(request, wait_time_seconds=0)
