"""What the console reads besides the SQS actions: a peek at a queue's messages, every queue's
depth (for the chart's samples) and the shard map. One source per kind of process:

- ``LocalSource``: ``sqsq server``, its one shard in this process (peeks through the shard
  service; depths sampled from the leader's applied state, no Raft round per sample).
- ``ClusterSource``: ``sqsq gateway --etcd``. Peeks go to each partition's shard leader as
  the Admin RPC ``PeekMessages``, found the way the gateway routes any call (the likeliest
  leader first, NotLeader followed; ``sqsq.gateway.routing``); the shard map is the
  partition map the gateway follows.
- ``NodeSource``: ``sqsq gateway --backend``, one node's Admin RPC.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

import grpc
import grpc.aio

from sqsq import admincred
from sqsq.api import SHARD_METADATA_KEY, QueueService
from sqsq.client import _auth, _call
from sqsq.core import peek, queries, regions
from sqsq.core.queues import queue_does_not_exist
from sqsq.errors import from_rejection
from sqsq.gateway.routing import follow_leader
from sqsq.v1 import admin_pb2 as pb
from sqsq.v1 import admin_pb2_grpc as pb_grpc

MAX_SAMPLED_QUEUES = 1000  # the chart keeps samples of this many queues at most (name order)
SAMPLE_CONCURRENCY = 8  # depth reads in flight at once while sampling over the API
CALL_TIMEOUT_S = 10.0
DEPTH_NAMES = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
               "ApproximateNumberOfMessagesDelayed"]

Depth = tuple[int, int, int]  # visible, in flight, delayed


@dataclass(frozen=True)
class Replica:
    node_id: str
    address: str  # its gRPC address ("" unknown)
    live: bool | None  # None: this process cannot tell
    leader: bool | None  # None: this process cannot tell


@dataclass(frozen=True)
class ShardView:
    shard_id: int
    replicas: tuple[Replica, ...]
    leader_term: int | None = None  # the term the leader was elected in, if known


class ConsoleSource(Protocol):
    api: QueueService

    async def peek(self, key: str, max_messages: int) -> peek.Peek: ...
    async def depths(self) -> dict[str, Depth]: ...
    def shard_map(self) -> list[ShardView]: ...
    async def close(self) -> None: ...


async def depths_over_api(api: QueueService) -> dict[str, Depth]:
    """Every queue's depth (up to MAX_SAMPLED_QUEUES) through GetQueueAttributes."""
    urls, _ = await api.list_queues("", MAX_SAMPLED_QUEUES)
    keys = [api.endpoint.queue_key(u) for u in urls]
    gate = asyncio.Semaphore(SAMPLE_CONCURRENCY)

    async def one(key: str) -> Depth | None:
        async with gate:
            try:
                a = await api.get_queue_attributes(key, DEPTH_NAMES)
            except Exception:  # noqa: BLE001 - deleted meanwhile, a node away: no sample
                return None
        return tuple(int(a.get(n, 0)) for n in DEPTH_NAMES)  # type: ignore[return-value]

    found = await asyncio.gather(*(one(k) for k in keys))
    return {k: d for k, d in zip(keys, found, strict=True) if d is not None}


class LocalSource:
    """``sqsq server``: ``api`` is its ShardService (duck-typed: the gateway does not import
    the shard package)."""

    def __init__(self, api: QueueService, address: str) -> None:
        self.api = api
        self.address = address

    async def peek(self, key: str, max_messages: int) -> peek.Peek:
        return await self.api.peek_messages(key, max_messages)  # type: ignore[attr-defined]

    async def depths(self) -> dict[str, Depth]:
        # the leader's applied state as it is: a sample needs no barrier (no Raft entry)
        def read(st, now):  # noqa: ANN001, ANN202
            out = {}
            for q in st.queues():
                if len(out) >= MAX_SAMPLED_QUEUES:
                    break
                if regions.region_of(q.name, st.config.region) == st.config.region:
                    c = queries.depth(st, q, now)
                    out[q.name] = (c.visible, c.in_flight, c.delayed)
            return out

        return self.api.engine.query(read)  # type: ignore[attr-defined]

    def shard_map(self) -> list[ShardView]:
        engine = self.api.engine  # type: ignore[attr-defined]
        term = engine.leading_term()
        return [ShardView(0, (Replica("this server", self.address, True, term is not None),),
                          term)]

    async def close(self) -> None:
        pass


class _AdminCaller:
    """Admin RPCs to a shard's leader over channels of its own (signed with the gateway's
    node credentials, env SQSQ_ACCESS_KEY_ID / SQSQ_SECRET_ACCESS_KEY, as its shard calls)."""

    def __init__(self, credentials: tuple[str, str] | None = None) -> None:
        self._creds = _auth.resolve(credentials)
        self._admin_key = admincred.load()  # env: SQSQ_ADMIN_TOKEN(_FILE)
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, target: str) -> pb_grpc.AdminStub:
        if target not in self._channels:
            self._channels[target] = _auth.signed_aio_channel(target, self._creds)
        return pb_grpc.AdminStub(self._channels[target])

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def peek(self, targets: list[str], shard_id: int | None, key: str, home: str,
                   max_messages: int) -> peek.Peek:
        """Queue ``key``'s peek from the first of ``targets`` that leads its shard: NotLeader
        is followed and an unreachable node passed over, by the SDK's rules (a peek is a
        read: safe to repeat)."""
        region, name = regions.split_key(key, home)
        request = pb.PeekMessagesRequest(queue_name=name, region=region,
                                         max_number_of_messages=max_messages)
        call = _call.Call("PeekMessages", request, parse=lambda r: r, retry=True)
        route = _call.Route(",".join(targets))
        metadata = ((SHARD_METADATA_KEY, str(shard_id)),) if shard_id is not None else ()
        metadata += admincred.metadata(self._admin_key, "/sqsq.v1.Admin/PeekMessages")
        _, response = await follow_leader(route, call, lambda target: self._stub(
            target).PeekMessages(request, timeout=route.attempt_timeout(call, CALL_TIMEOUT_S),
                                 metadata=metadata))
        return peek_from_pb(response)


def peek_from_pb(r: pb.PeekMessagesResponse) -> peek.Peek:
    return peek.Peek(
        tuple(peek.PeekedMessage(
            m.message_id, m.body, m.body_truncated, m.sent_ms, m.state, m.receive_count,
            m.visible_at_ms, m.group_id if m.HasField("group_id") else None,
            m.dead_letter_source_arn if m.HasField("dead_letter_source_arn") else None)
            for m in r.messages),
        r.oldest_sent_ms if r.HasField("oldest_sent_ms") else None, r.now_ms)


def merge_peeks(peeks: list[peek.Peek], max_messages: int) -> peek.Peek:
    """A partitioned queue's peek: the oldest of all partitions' messages."""
    messages = sorted((m for p in peeks for m in p.messages), key=lambda m: m.sent_ms)
    oldest = [p.oldest_sent_ms for p in peeks if p.oldest_sent_ms is not None]
    return peek.Peek(tuple(messages[:max_messages]), min(oldest) if oldest else None,
                     max((p.now_ms for p in peeks), default=0))


class ClusterSource:
    """``sqsq gateway --etcd``: ``api`` is its ClusterApi (its partition map and caller)."""

    def __init__(self, api: QueueService) -> None:
        self.api = api
        self._admin = _AdminCaller()

    async def peek(self, key: str, max_messages: int) -> peek.Peek:
        rejection = peek.check_max(max_messages)
        if rejection is not None:
            raise from_rejection(rejection)
        record = self.api.map.snapshot.queue(key)  # type: ignore[attr-defined]
        if record is None:
            raise from_rejection(queue_does_not_exist())
        caller = self.api.caller  # type: ignore[attr-defined]
        home = self.api.endpoint.region
        peeks = await asyncio.gather(*(
            self._admin.peek(caller.targets(s), s, key, home, max_messages)
            for s in record.partitions))
        return merge_peeks(list(peeks), max_messages)

    async def depths(self) -> dict[str, Depth]:
        return await depths_over_api(self.api)

    def shard_map(self) -> list[ShardView]:
        snapshot = self.api.map.snapshot  # type: ignore[attr-defined]
        out = []
        for shard_id, shard in sorted(snapshot.shards.items()):
            hint = snapshot.leaders.get(shard_id)
            leader = hint.node_id if hint is not None and hint.node_id in shard.replicas \
                else None
            replicas = tuple(Replica(
                n, snapshot.members[n].grpc_address if n in snapshot.members else "",
                n in snapshot.nodes, n == leader) for n in shard.replicas)
            out.append(ShardView(shard_id, replicas, hint.term if leader else None))
        return out

    async def close(self) -> None:
        await self._admin.close()


class NodeSource:
    """``sqsq gateway --backend``: ``api`` is its ForwardingApi, in front of one node."""

    def __init__(self, api: QueueService) -> None:
        self.api = api
        self.target: str = api.target  # type: ignore[attr-defined]
        self._admin = _AdminCaller()

    async def peek(self, key: str, max_messages: int) -> peek.Peek:
        return await self._admin.peek([self.target], None, key, self.api.endpoint.region,
                                      max_messages)

    async def depths(self) -> dict[str, Depth]:
        return await depths_over_api(self.api)

    def shard_map(self) -> list[ShardView]:
        return [ShardView(0, (Replica("backend node", self.target, None, None),))]

    async def close(self) -> None:
        await self._admin.close()
