"""Direct routing's calls (``sqsq.client._direct`` says where they go): each part of a
message call made at its shard's leader, asyncio (``AsyncRouter``, here) and blocking
(``SyncRouter``, ``sqsq.client._routed_sync``), over the stubs a client keeps per node (the
stream, moved to the node's frame connection when it offers one).

At a shard, a call follows the SDK's rules (``_call.Route``): NotLeader is followed to the
leader it names, an UNAVAILABLE retried only where it may be. A call waiting at a node that
stopped answering is abandoned once the gateway names a leader of a newer term, and made
again there (``_abandon``): while a call has waited a moment, its queue's route is asked for
again every ``STALL_POLL_S``. It goes through the gateway
instead (``Fallback``) only while none of it can have run: no node of the shard reachable,
the node refusing this client's credentials, or not knowing the queue (then its route is
asked for again). A call whose outcome is unknown stays at its shard, where its request id
makes a retry safe (through the gateway a standard queue's send could land on another
partition).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc

from sqsq.client import _call, _ops, _stubs
from sqsq.client._abandon import STALL_AFTER_S, STALL_POLL_S, Abandon, Waiting
from sqsq.client._direct import Fallback, Part, QueueRoute, Table, merged, parts, quick_receive
from sqsq.errors import NotLeader
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import AUTH_REFUSALS, NOT_RUN, REGION_METADATA_KEY, first_found, in_background


def _details(err: grpc.RpcError) -> str:
    details_fn = getattr(err, "details", None)
    return (details_fn() if callable(details_fn) else None) or ""


def _identity(reply: Any) -> Any:
    return reply


class _Hop:
    """One part's attempts at one shard: which node now, whether it may have run."""

    def __init__(self, router: _Router, route: QueueRoute, shard: int, call: _call.Call,
                 timeout: float | None, key: tuple[str, str | None]) -> None:
        targets = router.table.targets(shard)
        if not targets:
            raise Fallback
        self.router, self.route, self.shard, self.call = router, route, shard, call
        self.key = key
        self.nodes = _call.Route.over(targets)
        self.timeout = self.nodes.attempt_timeout(call, timeout)
        self.metadata = route.metadata(shard)
        self.started = time.monotonic()
        self.attempt = 0
        self.ran = False  # an attempt whose outcome is unknown

    def begin(self) -> tuple[Any, int, Abandon]:
        """The attempt's method (at the current node), id and handle, in flight from now."""
        router, shard, node = self.router, self.shard, self.nodes.current
        ident, handle = router.waiting.begin(shard, node, router.table.terms.get(shard, 0),
                                             self.key)
        stub = router._stub(node)  # noqa: SLF001
        method = getattr(stub, self.call.method)
        if isinstance(stub, _stubs._StubBase):  # noqa: SLF001 - the stream's stubs end it
            method = _with_abandon(method, handle)
        return method, ident, handle

    def abandoned(self, handle: Abandon) -> None:
        """Made again at the newer leader at once; the first attempt's outcome is unknown."""
        self.nodes.current, self.ran = handle.leader, True
        self.attempt += 1

    def request(self, first: Any) -> Any:
        """The request this attempt makes: a long poll made again waits what is left."""
        return _call.attempt_request(first, self.attempt, self.started)

    def answered(self) -> None:
        self.router.table.answered(self.shard, self.nodes.current)
        self.router.table.stats.direct += 1

    def failed(self, err: grpc.RpcError, queue: str, region: str | None) -> float:
        """How long to wait before the next attempt; raises the call's error, or
        ``Fallback`` for the gateway."""
        table = self.router.table
        if _call.never_sent(err):
            table.unreachable(self.nodes.current)
            rest = table.targets(self.shard)
            if not rest:
                if self.ran:
                    raise _call.map_rpc_error(err) from None
                raise Fallback
            self.nodes.targets, self.nodes.current = rest, rest[0]
            return 0.0
        error = _call.map_rpc_error(err)
        if not self.ran and error.code == "QueueDoesNotExist":
            table.forget(queue, region)  # moved, or gone: the gateway says which
            raise Fallback
        if not self.ran and error.code in AUTH_REFUSALS:
            table.off = True  # the nodes do not let this client in: the gateway does
            raise Fallback
        if not isinstance(error, NotLeader) and NOT_RUN not in _details(err):
            self.ran = self.ran or _call._unavailable(err) or err.code() == (  # noqa: SLF001
                grpc.StatusCode.DEADLINE_EXCEEDED)
        error, delay = self.nodes.retry_after(self.call, err, self.attempt,
                                              time.monotonic() - self.started)
        if delay is None:
            if not self.ran and error.code == "ServiceUnavailable":
                table.forget(queue, region)  # no leader found: ask where it is now
                raise Fallback
            raise error from None
        if not self.ran and table.is_down(self.nodes.current):
            raise Fallback  # NotLeader names a node this client cannot reach
        self.attempt += 1
        return delay


def _with_abandon(method: Any, handle: Abandon) -> Any:
    return lambda request, **kw: method(request, abandon=handle, **kw)


class _Router:
    """What both routers share: the table, the node stubs, the route lookup's handling,
    the calls in flight."""

    def __init__(self, table: Table, addresses: Mapping[str, str] | None) -> None:
        self.table = table
        self._addresses = dict(addresses or {})
        self._stubs: dict[str, tuple[Any, Any]] = {}
        self.waiting = Waiting()

    def _stub(self, address: str) -> Any:
        raise NotImplementedError

    def slow_queues(self) -> set[tuple[str, str | None]]:
        """A queue for each shard with a call that has waited a while (whose route names
        the shard's leader: one lookup a shard, however many of its queues wait)."""
        slow = self.waiting.slow(STALL_AFTER_S)
        return {min(keys, key=repr) for keys in slow.values()}  # type: ignore[misc]

    def relearn(self, queue: str, region: str | None, reply: pb.QueueRoute) -> None:
        """A route asked for again: calls a newer leader makes stale are abandoned."""
        self.table.learn(queue, region, reply)
        for p in reply.partitions:
            if p.leader:
                self.waiting.newer_leader(p.shard, p.leader, p.leader_term)

    def target(self, address: str) -> str:
        """How this client reaches a node the cluster knows as ``address``."""
        return self._addresses.get(address, address)

    @staticmethod
    def request_of(queue: str, region: str | None) -> tuple[pb.QueueRequest, Any]:
        metadata = ((REGION_METADATA_KEY, region),) if region else ()
        return pb.QueueRequest(queue_url=queue), metadata

    def refused(self, err: grpc.RpcError, queue: str, region: str | None) -> Fallback:
        """The gateway gave no route: routing off for a server that has none (a single
        shard group, a node, an older server), else none for this queue for a moment."""
        if err.code() == grpc.StatusCode.UNIMPLEMENTED or "must carry a call" in _details(err):
            self.table.off = True
        else:
            self.table.unroutable(queue, region)
        return Fallback()

    def key(self, call: _call.Call, region: str | None) -> tuple[str, str | None]:
        return call.request.queue_url, call.region or region

    @staticmethod
    def receive_parts(route: QueueRoute, request: Any, turn: int) -> list[Part]:
        n = len(route.shards)
        order = route.shards[turn % n:] + route.shards[:turn % n]
        return [(s, request) for s in order]

    @staticmethod
    def part_call(call: _call.Call, request: Any) -> _call.Call:
        return dataclasses.replace(call, request=request, parse=_identity)


class AsyncRouter(_Router):
    """Direct routing for ``AsyncClient``: ``run`` answers a message call, or raises
    ``Fallback``. ``gateway`` makes a call through the gateway (the client's own path);
    ``open_stub`` opens a stub to a node."""

    def __init__(self, table: Table, gateway: Callable[[_call.Call], Awaitable[Any]],
                 gateway_stub: Callable[[], Any], open_stub: Callable[[str], Any],
                 addresses: Mapping[str, str] | None = None) -> None:
        super().__init__(table, addresses)
        self._gateway, self._gateway_stub, self._open = gateway, gateway_stub, open_stub
        self._fetching: dict[tuple[str, str | None], asyncio.Future] = {}
        self._watcher: asyncio.Task | None = None
        self._releases: set[asyncio.Future] = set()  # ``in_background``

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        for channel, _ in self._stubs.values():
            await channel.close()
        self._stubs.clear()

    def _stub(self, address: str) -> Any:
        target = self.target(address)
        if target not in self._stubs:
            self._stubs[target] = self._open(target)
        return self._stubs[target][1]

    async def _route(self, queue: str, region: str | None) -> QueueRoute:
        found = self.table.route(queue, region)
        if found is False:
            raise Fallback
        if found:
            return found  # type: ignore[return-value]
        key = (queue, region)
        fetching = self._fetching.get(key)
        if fetching is None:  # concurrent calls to a queue wait for one lookup
            fetching = self._fetching[key] = asyncio.ensure_future(self._fetch(queue, region))
            fetching.add_done_callback(lambda _: self._fetching.pop(key, None))
        return await asyncio.shield(fetching)

    async def _fetch(self, queue: str, region: str | None) -> QueueRoute:
        request, metadata = self.request_of(queue, region)
        try:
            reply = await self._gateway_stub().DescribeQueueRoute(
                request, timeout=_call.ATTEMPT_S, metadata=metadata)
        except grpc.RpcError as err:
            raise self.refused(err, queue, region) from None
        return self.table.learn(queue, region, reply)

    async def run(self, call: _call.Call, region: str | None, timeout: float | None) -> Any:
        queue, region = self.key(call, region)
        route = await self._route(queue, region)
        if call.method == "ReceiveMessage" and len(route.shards) > 1:
            return await self._fan_out(route, call, queue, region, timeout)
        split = parts(call.method, call.request, route, self.table.sends)
        if len(split) == 1:
            return await self._at(route, split[0], call, queue, region, timeout)
        replies = await asyncio.gather(*(self._part(route, p, call, queue, region, timeout)
                                         for p in split))
        return merged(call.method, list(replies))

    async def _part(self, route: QueueRoute, part: Part, call: _call.Call, queue: str,
                    region: str | None, timeout: float | None) -> Any:
        """One part of a split call; through the gateway if it cannot go direct."""
        try:
            return await self._at(route, part, call, queue, region, timeout)
        except Fallback:
            self.table.stats.fallbacks += 1
            return await self._gateway(self.part_call(call, part[1]))

    async def _at(self, route: QueueRoute, part: Part, call: _call.Call, queue: str,
                  region: str | None, timeout: float | None) -> Any:
        shard, request = part
        hop = _Hop(self, route, shard, call, timeout, (queue, region))
        while True:
            method, ident, handle = hop.begin()
            if self._watcher is None:
                self._watcher = asyncio.ensure_future(self._watch())
            try:
                reply = await method(hop.request(request), timeout=hop.timeout,
                                     metadata=hop.metadata)
            except grpc.RpcError as err:
                if handle.fired:
                    hop.abandoned(handle)
                    continue
                await asyncio.sleep(hop.failed(err, queue, region))
            else:
                hop.answered()
                return reply
            finally:
                self.waiting.end(shard, ident)

    async def _watch(self) -> None:
        """While calls are in flight: the routes of those that waited a while, asked for
        again (``_Router.relearn``)."""
        try:
            while self.waiting:
                await asyncio.sleep(STALL_POLL_S)
                for queue, region in self.slow_queues():
                    request, metadata = self.request_of(queue, region)
                    try:
                        reply = await self._gateway_stub().DescribeQueueRoute(
                            request, timeout=2 * STALL_POLL_S, metadata=metadata)
                    except grpc.RpcError:
                        continue  # the gateway away too: the calls wait out their deadline
                    self.relearn(queue, region, reply)
        finally:
            self._watcher = None

    async def _fan_out(self, route: QueueRoute, call: _call.Call, queue: str,
                       region: str | None, timeout: float | None) -> Any:
        """A receive from several partitions, as the gateway does it: each one looked at
        now, in turn; then, if all were empty, a long poll at each, the first to answer with
        messages winning (``sqsq.wire.first_found``: what the others took is released)."""
        request, spread, key = call.request, self.table.receives, (queue, region)
        first = spread.first(key)
        shards = route.shards
        n = len(shards)
        quick = quick_receive(request)
        # (made directly: most receives end at the first look, and ``replace`` costs more)
        now = _call.Call(call.method, request, call.parse, call.retry, None, call.region)
        reply = None  # (n > 1: every look sets it)
        began = time.monotonic()
        for k in range(n):
            reply = await self._at(route, (shards[(first + k) % n], quick), now, queue, region,
                                   timeout)
            if reply.messages:
                spread.found(key, first + k)
                return reply
        # what the look took (a leader being elected) is not waited again
        left = _call.wait_left(request, time.monotonic() - began)
        if left.HasField("wait_time_seconds") and left.wait_time_seconds == 0:
            return reply
        order = [(shard, left) for shard, _ in self.receive_parts(route, request, first)]
        k, found = await first_found(
            [self._at(route, p, call, queue, region, timeout) for p in order],
            lambda r: bool(r.messages),
            lambda k, taken: self._release(route, order[k][0], call, queue, region, taken))
        if found is None:
            return reply
        spread.found(key, first + k)
        return found

    def _release(self, route: QueueRoute, shard: int, call: _call.Call, queue: str,
                 region: str | None, taken: Any) -> None:
        """Messages a long poll took that its caller will not get: visible again now."""
        release = dataclasses.replace(
            _ops.release_messages(call.request.queue_url, taken.messages), region=call.region)
        in_background(self._releases, self._part(route, (shard, release.request), release,
                                                 queue, region, None))
