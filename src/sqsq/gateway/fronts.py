"""The two public doors, SQS HTTP and gRPC, over any ``QueueService``; and the process
plumbing both ``sqsq server`` and ``sqsq gateway`` need: signals, the start-up banner."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import grpc
from aiohttp import web
from prometheus_client import CollectorRegistry

from sqsq.api import Endpoint, QueueService
from sqsq.gateway import logs
from sqsq.gateway.auth import Authenticator, GrpcAuthInterceptor
from sqsq.gateway.console import ConsoleSource
from sqsq.gateway.frames import FrameServer
from sqsq.gateway.grpc_calls import GRPC_ACTIONS
from sqsq.gateway.grpc_service import QueuesService
from sqsq.gateway.http import AppRunner, make_app
from sqsq.gateway.http.actions import ACTIONS
from sqsq.gateway.metrics import ApiMetrics
from sqsq.v1 import queues_pb2_grpc as pb_grpc

log = logging.getLogger("sqsq.server")
STOP_GRACE_S = 2.0  # for the calls under way when a server stops
GC_YOUNG_THRESHOLD = 10_000  # allocations between collections of the youngest generation


def endpoint_for(host: str, http_port: int, public_url: str | None, account: str,
                 region: str) -> Endpoint:
    base_url = public_url or os.environ.get("SQSQ_PUBLIC_URL") or f"http://{host}:{http_port}"
    return Endpoint(base_url.rstrip("/"), account, region)


@dataclass
class Fronts:
    runner: web.AppRunner | None  # None: no HTTP door (a node serves gRPC only)
    grpc_server: grpc.aio.Server
    grpc_port: int
    queues: QueuesService | None = None
    frames: FrameServer | None = None

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.queues is not None:  # else open streams would hold the stop for its grace
            self.queues.drain_streams()
        stops = [self.grpc_server.stop(grace=STOP_GRACE_S)]
        if self.frames is not None:
            stops.append(self.frames.stop(grace=STOP_GRACE_S))
        await asyncio.gather(*stops)


async def start_fronts(
    api: QueueService, auth: Authenticator, host: str, grpc_port: int, http_port: int | None,
    add_services: Callable[[grpc.aio.Server], None] | None = None,
    select: Callable[[grpc.aio.ServicerContext], QueueService] | None = None,
    metrics: ApiMetrics | None = None,
    console: ConsoleSource | None = None,
    frame_port: int | None = None,
) -> Fronts:
    """HTTP first: tests and scripts take the gRPC port listening as "ready" (the frame
    connection, on ``frame_port`` (0: any free one; None: none), listens before it)."""
    runner = None
    if http_port is not None:
        runner = AppRunner(make_app(api, auth, metrics, console), access_log=None,
                           shutdown_timeout=2.0)
        await runner.setup()
        await web.TCPSite(runner, host, http_port).start()
    # An open server's interceptor would pass every call through unchanged, at the cost of an
    # extra coroutine per call: install it only when there is something to check.
    # so_reuseport 0: gRPC's default lets a second server bind the same port, and clients
    # then alternate between two data sets; here the second one fails to start instead.
    server = grpc.aio.server(interceptors=[] if auth.open else [GrpcAuthInterceptor(auth)],
                             options=[("grpc.so_reuseport", 0)])
    # ``select``: a node hosting several shards picks the shard's service per call.
    queues = QueuesService(api, metrics=metrics) if select is None else \
        QueuesService(select=select, metrics=metrics)
    pb_grpc.add_QueuesServicer_to_server(queues, server)
    if add_services is not None:
        add_services(server)
    frames = None
    try:
        bound = _bind_grpc(server, host, grpc_port)  # (listening only from server.start())
        if frame_port is not None:
            frames = FrameServer(queues, auth)
            await frames.start(host, frame_port)
    except OSError:
        if frames is not None:
            await frames.stop(grace=0)
        if runner is not None:
            await runner.cleanup()
        raise
    await server.start()
    if frames is not None:
        log.info("frame connections on %s:%d", host, frames.port)
    return Fronts(runner, server, bound, queues, frames)


def _bind_grpc(server: grpc.aio.Server, host: str, port: int) -> int:
    """The port bound, or an OSError that says so in one line. gRPC reports a failed bind only
    as a log line of its own and a bare RuntimeError, so a port in use is found first by trying
    it (a later bind by another process is still caught, without the reason)."""
    where = f"cannot listen for gRPC on {host}:{port}"
    if port:
        try:
            addresses = socket.getaddrinfo(host.strip("[]") or None, port,
                                           type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError as e:
            raise OSError(f"{where}: {e.strerror}") from None
        for family, kind, proto, _, address in addresses:
            try:
                with socket.socket(family, kind, proto) as probe:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
                    probe.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise OSError(f"{where}: address already in use") from None
                # anything else (no IPv6 here, ...): gRPC decides
    try:
        return server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        raise OSError(f"{where}: the port is in use or the address is not available") from None


ACTION_NAMES = frozenset(ACTIONS) | GRPC_ACTIONS  # the action label's values


def api_metrics(registry: CollectorRegistry) -> ApiMetrics:
    return ApiMetrics(registry, ACTION_NAMES)


def announce(text: str, *, warning: bool = False) -> None:
    """A line about the process itself (listening, stopped): on stdout as it is, or, with
    ``--log-format json``, as a log line like every other."""
    if logs.json_mode():
        log.log(logging.WARNING if warning else logging.INFO, "%s", text)
    else:
        print(text, flush=True)


def announce_auth(name: str, auth: Authenticator) -> None:
    if auth.open:
        announce(f"{name}: WARNING: no credentials configured - authentication is OFF, "
                 "anyone who can reach these ports can use every queue. Set "
                 "SQSQ_CREDENTIALS_FILE or SQSQ_ACCESS_KEY_ID/SQSQ_SECRET_ACCESS_KEY to "
                 "require SigV4 (HTTP) and signed tokens (gRPC).", warning=True)
    else:
        announce(f"{name}: authentication ON ({len(auth.credentials)} access key(s)); "
                 "HTTP requires SigV4, gRPC a signed token")


async def until_signalled() -> None:
    """Serve until SIGTERM or SIGINT. Called once the process has started: what start-up
    made (modules, the gRPC and protobuf machinery, the shard's objects) is moved out of the
    cyclic collector's sight first (``gc.freeze``), since it is never garbage, and every
    collection of the oldest generation walked all of it again: under load, one every few
    thousand calls, and a share of every call's CPU. The youngest generation is collected
    every ``GC_YOUNG_THRESHOLD`` allocations, not Python's 700: a call makes dozens of
    objects (its task, coroutines, future, protobuf and core values), nearly all freed by
    reference counting alone, and a collection every few calls was mostly walking them."""
    gc.collect()  # (start-up's own garbage first: frozen, it would stay)
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


# The event loop a server process runs on, by ``SQSQ_EVENT_LOOP``. uvloop's is the default:
# a node's Raft traffic, the SDK's frame connections and their timers are asyncio protocols
# and callbacks, and on uvloop a replicated lone send was 1.07-1.11x as fast with less CPU
# per message (docs/benchmarks.md). ``asyncio`` is the standard library's, for comparison
# or should uvloop misbehave somewhere.
EVENT_LOOPS = ("uvloop", "asyncio")


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory ``SQSQ_EVENT_LOOP`` names (None: ``asyncio.run``'s own); ValueError for a
    name it does not know."""
    name = os.environ.get("SQSQ_EVENT_LOOP", "").strip().lower() or EVENT_LOOPS[0]
    if name not in EVENT_LOOPS:
        raise ValueError(f"SQSQ_EVENT_LOOP is {name!r}; it takes one of "
                         f"{', '.join(EVENT_LOOPS)}")
    if name == "asyncio":
        return None
    import uvloop  # (only when chosen)

    return uvloop.new_event_loop


def run_process(name: str, main: Coroutine[Any, Any, None], log_format: str = "text") -> int:
    """Run a server coroutine with logging set up; 1 with a one-line error if it cannot."""
    logs.setup(log_format)
    try:
        try:
            factory = event_loop_factory()
        except ValueError:
            main.close()  # never started
            raise
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(main)
    except (OSError, ValueError) as e:  # unreadable credentials file, port in use, ...
        if logs.json_mode():
            log.error("%s: error: %s", name, e)
        else:
            print(f"{name}: error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0
