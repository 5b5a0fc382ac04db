"""Calling a shard's leader: where the gateway's calls to the nodes go.

The partition map names a shard's replicas and, as a hint, its leader; the shard itself has
the last word (a follower answers NotLeader, naming the leader if it knows it). A call goes
first to the node that answered last time, else to the hinted leader, else to the replicas in
turn; it follows NotLeader to the node named, moves on from a node it cannot reach, and gives
up with ServiceUnavailable after the SDK's failover window. Retry rules are the SDK's
(``client._call.Route``): an UNAVAILABLE is retried only for a call that is safe to repeat.

The map is read from its in-memory snapshot only: etcd being away changes nothing here.

A call waiting at a node that stopped answering (frozen, cut off) is abandoned as soon as
the map names a leader of its shard elected in a newer term, and made again there
(``sqsq.client._abandon``): the map's watch tells the gateway within moments of the
election, not when the call's deadline runs out.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from sqsq.api import SHARD_METADATA_KEY
from sqsq.client import _auth, _call, _direct, _stubs
from sqsq.client._abandon import Waiting
from sqsq.client.aio import open_stub
from sqsq.control.partition_map import MapSnapshot, PartitionMap
from sqsq.core import regions
from sqsq.errors import NotLeader, ServiceUnavailable
from sqsq.v1 import queues_pb2_grpc
from sqsq.wire import ReceiveSpread, SendSpread

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
        # shard -> the node that answered it last, and the leader term known then
        self._answered: dict[int, tuple[str, int]] = {}
        self.waiting = Waiting()  # calls in flight, abandoned when a newer leader is known
        self._watch: asyncio.Task | None = None
        # a standard queue's sends take its partitions a burst at a time, and receives look
        # first where messages were last found (``sqsq.wire``): for every front's calls
        self.sends = SendSpread()
        self.receives = ReceiveSpread()
        self.on_pass: Callable[[str], None] | None = None  # (action) per call passed through
        # (shard, was it NotLeader) per retry: the gateway's metrics
        self.on_retry: Callable[[int, bool], None] | None = None

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
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
        # The node that answered last goes first only while its lease holds (one cut off
        # from the cluster, etcd included, loses it within seconds) and no leader of a newer
        # term is known: every call would otherwise wait at it before moving on.
        answered, term = self._answered.get(shard_id, ("", 0))
        if term < _term(snapshot, shard_id):
            answered = ""
        first = [a for a in (answered, hint.grpc_address if hint else None) if a in live]
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
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._follow_leaders())
        while True:
            request = _call.attempt_request(call.request, attempt, started)
            stub = self._stub(route.current)
            term = _term(self.map.snapshot, shard_id)
            ident, abandon = self.waiting.begin(shard_id, route.current, term)
            try:
                if isinstance(stub, _stubs._StubBase):  # noqa: SLF001 - the stream's stubs
                    result = await getattr(stub, call.method)(
                        request, timeout=timeout, metadata=metadata, abandon=abandon)
                else:  # unary calls (env SQSQ_STREAM=0) wait out their deadline
                    result = await getattr(stub, call.method)(
                        request, timeout=timeout, metadata=metadata)
                self._answered[shard_id] = (route.current, term)
                return call.parse(result)
            except grpc.RpcError as err:
                if self._answered.get(shard_id, ("",))[0] == route.current and err.code() in (
                        grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                    del self._answered[shard_id]  # the next call starts from the hint
                if abandon.fired:  # a newer leader is known: made again there at once
                    route.current = abandon.leader
                    attempt += 1
                    if self.on_retry is not None:
                        self.on_retry(shard_id, False)
                    continue
                error, delay = route.retry_after(call, err, attempt, time.monotonic() - started)
                if delay is None:
                    raise error from None
                if self.on_retry is not None:
                    self.on_retry(shard_id, isinstance(error, NotLeader))
                attempt += 1
                await asyncio.sleep(delay)
            finally:
                self.waiting.end(shard_id, ident)

    async def _follow_leaders(self) -> None:
        """Abandon the calls a newly published leader makes stale, as the map changes."""
        known: dict[int, tuple[str, int]] = {}
        revision = -1
        while True:
            try:
                snapshot = await self.map.wait_for(lambda s: s.revision != revision)  # noqa: B023
            except TimeoutError:
                continue
            revision = snapshot.revision
            for shard_id, hint in snapshot.leaders.items():
                node = snapshot.leader_hint(shard_id)
                if node is None or known.get(shard_id) == (node.grpc_address, hint.term):
                    continue
                known[shard_id] = (node.grpc_address, hint.term)
                self.waiting.newer_leader(shard_id, node.grpc_address, hint.term)


def _term(snapshot: MapSnapshot, shard_id: int) -> int:
    """The Raft term of the shard's published leader (0: none published)."""
    hint = snapshot.leaders.get(shard_id)
    return hint.term if hint is not None else 0


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
    # (only a send needs where sends go: the map's walk over its leaders is not paid by the rest)
    home, width = caller.map.snapshot.send_partitions(key) if method in _RETRY else (0, 0)
    route = _direct.QueueRoute(name, region, name.endswith(".fifo"), record.partitions, 0, 0.0,
                               home, width)
    if method == "ReceiveMessage" and len(record.partitions) > 1:
        return None
    split = _direct.parts(method, request, route, caller.sends)
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
