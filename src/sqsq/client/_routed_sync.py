"""Direct routing's calls for the blocking ``Client`` (``SyncRouter``): as
``sqsq.client._routed``'s ``AsyncRouter``, from the caller's own thread, with one thread per
client watching the routes of queues whose calls stall (``_abandon``)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from sqsq.client import _call, _stubs
from sqsq.client._abandon import STALL_POLL_S
from sqsq.client._direct import Fallback, Part, QueueRoute, Table, merged, parts, quick_receive
from sqsq.client._routed import _Hop, _Router
from sqsq.v1 import queues_pb2 as pb


class SyncRouter(_Router):
    """Direct routing for the blocking ``Client``; as ``AsyncRouter``, except that a
    partitioned queue's long poll goes through the gateway (which waits on every partition
    at once) after the look at each partition found nothing."""

    def __init__(self, table: Table, gateway: Callable[[_call.Call], Any],
                 gateway_stub: Callable[[], Any], open_stub: Callable[[str], Any],
                 addresses: Mapping[str, str] | None = None) -> None:
        super().__init__(table, addresses)
        self._gateway, self._gateway_stub, self._open = gateway, gateway_stub, open_stub
        self._watch_lock = threading.Lock()  # starting and ending the route watch
        self._fetch_lock = threading.Lock()  # a route being asked for, or the close
        self._watching = self._closed = False

    def close(self) -> None:
        with self._watch_lock, self._fetch_lock:
            self._closed = True
        _stubs.close_all(self._stubs)

    def _stub(self, address: str) -> Any:
        target = self.target(address)
        with self.table.lock:
            if target not in self._stubs:
                self._stubs[target] = self._open(target)
            return self._stubs[target][1]

    def _route(self, queue: str, region: str | None) -> QueueRoute:
        found = self.table.route(queue, region)
        if found is False:
            raise Fallback
        if found:
            return found  # type: ignore[return-value]
        request, metadata = self.request_of(queue, region)
        try:
            reply = self._gateway_stub().DescribeQueueRoute(
                request, timeout=_call.ATTEMPT_S, metadata=metadata)
        except grpc.RpcError as err:
            raise self.refused(err, queue, region) from None
        return self.table.learn(queue, region, reply)

    def run(self, call: _call.Call, region: str | None, timeout: float | None) -> Any:
        queue, region = self.key(call, region)
        route = self._route(queue, region)
        if call.method == "ReceiveMessage" and len(route.shards) > 1:
            return self._sweep(route, call, queue, region, timeout)
        split = parts(call.method, call.request, route, self.table.sends)
        if len(split) == 1:
            return self._at(route, split[0], call, queue, region, timeout)
        return merged(call.method, [self._part(route, p, call, queue, region, timeout)
                                    for p in split])

    def _part(self, route: QueueRoute, part: Part, call: _call.Call, queue: str,
              region: str | None, timeout: float | None) -> Any:
        try:
            return self._at(route, part, call, queue, region, timeout)
        except Fallback:
            self.table.stats.fallbacks += 1
            return self._gateway(self.part_call(call, part[1]))

    def _at(self, route: QueueRoute, part: Part, call: _call.Call, queue: str,
            region: str | None, timeout: float | None) -> Any:
        shard, request = part
        hop = _Hop(self, route, shard, call, timeout, (queue, region))
        while True:
            method, ident, handle = hop.begin()
            self._ensure_watch()
            try:
                reply = method(hop.request(request), timeout=hop.timeout,
                               metadata=hop.metadata)
            except grpc.RpcError as err:
                if handle.fired:
                    hop.abandoned(handle)
                    continue
                time.sleep(hop.failed(err, queue, region))
            else:
                hop.answered()
                return reply
            finally:
                self.waiting.end(shard, ident)

    def _ensure_watch(self) -> None:
        with self._watch_lock:
            if self._watching or self._closed:
                return
            self._watching = True
        threading.Thread(target=self._watch, name="sqsq-route-watch", daemon=True).start()

    def _watch(self) -> None:
        """While calls are in flight: the routes of those that waited a while, asked for
        again (``_Router.relearn``). The thread ends when none is (a call starts another)."""
        while True:
            time.sleep(STALL_POLL_S)
            with self._watch_lock:
                if self._closed or not self.waiting:
                    self._watching = False
                    return
            for queue, region in self.slow_queues():
                request, metadata = self.request_of(queue, region)
                with self._fetch_lock:  # (close waits for it: the channel stays open)
                    if self._closed:
                        return
                    try:
                        reply = self._gateway_stub().DescribeQueueRoute(
                            request, timeout=2 * STALL_POLL_S, metadata=metadata)
                    except grpc.RpcError:
                        continue  # the gateway away too: the calls wait out their deadline
                self.relearn(queue, region, reply)

    def _sweep(self, route: QueueRoute, call: _call.Call, queue: str, region: str | None,
               timeout: float | None) -> Any:
        request = call.request
        quick = quick_receive(request)
        now = dataclasses.replace(call, min_timeout=None)
        reply = pb.ReceiveMessageResponse()
        spread, key = self.table.receives, (queue, region)
        first = spread.first(key)
        began = time.monotonic()
        for k, (shard, _) in enumerate(self.receive_parts(route, request, first)):
            reply = self._at(route, (shard, quick), now, queue, region, timeout)
            if reply.messages:
                spread.found(key, first + k)
                return reply
        # what the look took (a leader being elected) is not waited again
        left = _call.wait_left(request, time.monotonic() - began)
        if left.HasField("wait_time_seconds") and left.wait_time_seconds == 0:
            return reply
        # the long poll: the gateway waits on all partitions at once
        raise Fallback(False, left)
