"""Calling a shard's leader: where the gateway's calls to the nodes go.

The partition map names a shard's replicas and, as a hint, its leader; the shard itself has
the last word (a follower answers NotLeader, naming the leader if it knows it). A call goes
first to the node that answered last time, else to the hinted leader, else to the replicas in
turn; it follows NotLeader to the node named, moves on from a node it cannot reach, and gives
up with ServiceUnavailable after the SDK's failover window. Retry rules are the SDK's
(``client._call.Route``): an UNAVAILABLE is retried only for a call that is safe to repeat.

The map is read from its in-memory snapshot only: etcd being away changes nothing here.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from sqsq.api import SHARD_METADATA_KEY
from sqsq.client import _auth, _call, _direct
from sqsq.client.aio import open_stub
from sqsq.control.partition_map import PartitionMap
from sqsq.core import regions
from sqsq.errors import NotLeader, ServiceUnavailable
from sqsq.v1 import queues_pb2_grpc

T = TypeVar("T")


async def follow_leader(route: _call.Route, call: _call.Call,
                        attempt: Callable[[str], Awaitable[T]]) -> tuple[str, T]:
    """``attempt(address)`` at ``route``'s nodes until one answers, by the SDK's rules for
    ``call`` (NotLeader followed, an unreachable node passed over when the call is safe to
    repeat); the address that answered and its answer."""
    started = time.monotonic()
    attempts = 0
    while True:
        target = route.current
        try:
            return target, await attempt(target)
        except grpc.RpcError as err:
            error, delay = route.retry_after(call, err, attempts, time.monotonic() - started)
            if delay is None:
                raise error from None
            attempts += 1
            await asyncio.sleep(delay)

CALL_TIMEOUT_S = 30.0


class ShardCaller:
    def __init__(self, partition_map: PartitionMap, *, timeout: float = CALL_TIMEOUT_S,
                 credentials: tuple[str, str] | None = None) -> None:
        self.map = partition_map
        self.timeout = timeout
        self._creds = _auth.resolve(credentials)
        self._stubs: dict[str, tuple[grpc.aio.Channel, queues_pb2_grpc.QueuesStub]] = {}
        self._answered: dict[int, str] = {}  # shard -> the node that answered it last
        self.turn = itertools.count()  # a standard queue's sends take turns (pass_through)
        self.on_pass: Callable[[str], None] | None = None  # (action) per call passed through
        # (shard, was it NotLeader) per retry: the gateway's metrics
        self.on_retry: Callable[[int, bool], None] | None = None

    async def close(self) -> None:
        for channel, _ in self._stubs.values():
            await channel.close()
        self._stubs.clear()

    def _stub(self, target: str) -> queues_pb2_grpc.QueuesStub:
        if target not in self._stubs:
            self._stubs[target] = open_stub(target, self._creds)
        return self._stubs[target][1]

    def targets(self, shard_id: int) -> list[str]:
        """The shard's replicas' gRPC addresses, the likeliest leader first."""
        snapshot = self.map.snapshot
        shard = snapshot.shards.get(shard_id)
        if shard is None:
            raise ServiceUnavailable(f"shard {shard_id} is not in the partition map")
        addresses = [snapshot.members[n].grpc_address for n in shard.replicas
                     if n in snapshot.members]
        hint = snapshot.leader_hint(shard_id)
        live = [snapshot.members[n].grpc_address for n in shard.replicas if n in snapshot.nodes]
        # The node that answered last goes first only while its lease holds: one cut off
        # from the cluster (etcd included) loses it within seconds, and every call would
        # otherwise wait out an attempt's deadline there before moving on.
        first = [a for a in (self._answered.get(shard_id),
                             hint.grpc_address if hint else None) if a in live]
        ordered = list(dict.fromkeys(first + live + addresses))
        if not ordered:
            raise ServiceUnavailable(f"shard {shard_id} has no replica with a known address")
        return ordered

    async def call(self, shard_id: int, call: _call.Call) -> Any:
        """``call`` answered by shard ``shard_id``'s leader."""
        route = _call.Route.over(self.targets(shard_id))
        metadata = ((SHARD_METADATA_KEY, str(shard_id)), *call.metadata())
        timeout = route.attempt_timeout(call, call.timeout(self.timeout))
        if not route.several and call.retry and call.min_timeout is None:
            timeout = min(timeout or _call.ATTEMPT_S, _call.ATTEMPT_S)
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                method = getattr(self._stub(route.current), call.method)
                result = await method(call.request, timeout=timeout, metadata=metadata)
                self._answered[shard_id] = route.current
                return call.parse(result)
            except grpc.RpcError as err:
                if self._answered.get(shard_id) == route.current and err.code() in (
                        grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                    del self._answered[shard_id]  # the next call starts from the hint
                error, delay = route.retry_after(call, err, attempt, time.monotonic() - started)
                if delay is None:
                    raise error from None
                if self.on_retry is not None:
                    self.on_retry(shard_id, isinstance(error, NotLeader))
                attempt += 1
                await asyncio.sleep(delay)


# ---- message calls passed through to one shard as they came --------------------------------

_RETRY = frozenset({"SendMessage", "SendMessageBatch"})  # deduplicated by their request id


def _identity(reply: Any) -> Any:
    return reply


async def pass_through(caller: ShardCaller, home: str, method: str, request: Any,
                       key: str) -> Any | None:
    """A message call (a gRPC request) answered by its one shard's leader as it came: the
    node's reply, or None when it is not for one shard (an unknown queue, a batch or a
    receive spanning partitions), which the caller decodes and routes as usual.

    The request is split as the SDK's direct routing splits it (``client._direct.parts``),
    so a call lands where the gateway's own routing would put it; the node decodes and
    validates it, so the gateway need not (nor convert it to the core's terms and back).
    """
    record = caller.map.snapshot.queue(key)
    if record is None:
        return None
    region, name = regions.split_key(key, home)
    route = _direct.QueueRoute(name, region, name.endswith(".fifo"), record.partitions, 0, 0.0)
    if method == "ReceiveMessage" and len(record.partitions) > 1:
        return None
    split = _direct.parts(method, request, route, next(caller.turn))
    if len(split) != 1:
        return None
    shard, part = split[0]
    part.queue_url = name  # the node is told the queue's name and region (forwarding.about)
    if method in _RETRY and not part.request_id:
        part.request_id = uuid.uuid4().hex  # so that a retry is deduplicated
    min_timeout = None
    if method == "ReceiveMessage":
        wait = part.wait_time_seconds if part.HasField("wait_time_seconds") \
            else _call.MAX_WAIT_SECONDS
        min_timeout = wait + _call.RECEIVE_DEADLINE_MARGIN
    call = _call.Call(method, part, _identity, retry=method in _RETRY, min_timeout=min_timeout,
                      region=region)
    if caller.on_pass is not None:
        caller.on_pass(method)
    return await caller.call(shard, call)
