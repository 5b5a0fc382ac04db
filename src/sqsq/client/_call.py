"""One RPC as data (``Call``), and what every caller of it shares: the target address, the
channel options, which failures may be retried and how a failure becomes a ``QueueError``.
Used by ``Client``, ``AsyncClient`` and the gateway's forwarding backend."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from sqsq.errors import NotLeader, QueueError, ServiceUnavailable, error_for, leader_of
from sqsq.frozen import quick_init
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import ERROR_CODE_KEY, NOT_RUN, REGION_METADATA_KEY

DEFAULT_ENDPOINT = "127.0.0.1:7400"
MAX_WAIT_SECONDS = 20  # SQS's longest long poll; the default when the queue decides
RECEIVE_DEADLINE_MARGIN = 10.0
RETRIES = 3  # retries after the first attempt, UNAVAILABLE only
BACKOFF = (0.1, 0.3, 0.9)
# With several nodes to try, a call keeps looking for the shard's leader this long: a new
# leader is elected within a few seconds of the old one failing.
FAILOVER_S = 15.0
NO_HINT_WAIT_S = 0.05  # a NotLeader without a leader's address: an election is under way
ATTEMPT_S = 5.0  # with several nodes, one attempt waits no longer (a stopped node never answers)


@quick_init  # (one or more per message sent)
@dataclass(frozen=True)
class Call:
    """One RPC to make: ``method`` names the stub attribute."""

    method: str
    request: Any
    parse: Callable[[Any], Any]
    retry: bool = False  # safe to repeat on UNAVAILABLE (read-only or idempotent by request id)
    min_timeout: float | None = None  # the deadline must be at least this (long polls)
    region: str | None = None  # the caller's region (None: the client's, else the server's)

    def metadata(self, region: str | None = None) -> tuple[tuple[str, str], ...]:
        """The call's gRPC metadata: its region, else ``region`` (the client's), if any."""
        region = self.region or region
        return ((REGION_METADATA_KEY, region),) if region else ()

    def timeout(self, default: float | None) -> float | None:
        if self.min_timeout is None:
            return default
        if default is None:
            return None
        return max(default, self.min_timeout)


def attempt_request(request: Any, attempt: int, started: float) -> Any:
    """The request of a call's attempt ``attempt`` (0: the first), the call made at
    ``started`` (``time.monotonic()``): a receive's long poll made again waits only what is
    left of its WaitTimeSeconds (to the nearest second), so that a leader change under it
    does not add a whole new wait to the one its caller asked for. Other requests are made
    again as they were."""
    if not attempt:
        return request
    return wait_left(request, time.monotonic() - started)


def wait_left(request: Any, elapsed_s: float) -> Any:
    """``request`` with what is left of its long poll's wait ``elapsed_s`` after it began
    (``attempt_request``)."""
    if not isinstance(request, pb.ReceiveMessageRequest) or not request.wait_time_seconds:
        return request  # not a long poll, or one whose queue decides its wait
    left = seconds_left(request.wait_time_seconds, elapsed_s)
    if left >= request.wait_time_seconds:
        return request
    again = pb.ReceiveMessageRequest()
    again.CopyFrom(request)
    again.wait_time_seconds = left
    return again


def seconds_left(wait_s: int, elapsed_s: float) -> int:
    """What is left of a wait of ``wait_s`` whole seconds ``elapsed_s`` into it, to the
    nearest second (a wire's WaitTimeSeconds is whole seconds)."""
    return max(0, int(wait_s - elapsed_s + 0.5))


class Route:
    """Where a client's calls go: one endpoint, or a shard's nodes (``a:1,b:2,c:3``), in which
    case a call follows NotLeader to the leader it names and moves on from a node it cannot
    reach, until one answers."""

    def __init__(self, endpoint: str | None) -> None:
        parts = [p for p in (endpoint or DEFAULT_ENDPOINT).split(",") if p.strip()]
        self.targets = [normalize_target(p) for p in parts] or [DEFAULT_ENDPOINT]
        self.current = self.targets[0]

    @classmethod
    def over(cls, targets: list[str]) -> Route:
        """Over addresses already in ``host:port`` form (a shard's nodes, as a gateway gives
        them): nothing to parse on each call."""
        route = cls.__new__(cls)
        route.targets, route.current = list(targets), targets[0]
        return route

    @property
    def several(self) -> bool:
        return len(self.targets) > 1

    def rotate(self) -> None:
        i = self.targets.index(self.current) if self.current in self.targets else -1
        self.current = self.targets[(i + 1) % len(self.targets)]

    def attempt_timeout(self, call: Call, timeout: float | None) -> float | None:
        """One attempt's deadline: with several nodes a call that is safe to repeat moves on
        from a node that does not answer (stopped, cut off) rather than wait out its whole
        deadline there. Long polls keep theirs."""
        if not self.several or not call.retry or call.min_timeout is not None:
            return timeout
        return ATTEMPT_S if timeout is None else min(timeout, ATTEMPT_S)

    def retry_after(self, call: Call, err: grpc.RpcError, attempt: int,
                    elapsed_s: float) -> tuple[QueueError, float | None]:
        """The error, and how long to wait before the next attempt (None: give up)."""
        error = map_rpc_error(err)
        if isinstance(error, NotLeader):  # never applied there: always safe to go on
            leader = leader_of(error)
            if leader:
                self.current = leader
            else:
                self.rotate()
            if elapsed_s < FAILOVER_S:
                return error, 0.0 if leader else NO_HINT_WAIT_S
            return ServiceUnavailable(f"no leader found: {error.message}"), None
        timed_out = _status(err) == grpc.StatusCode.DEADLINE_EXCEEDED
        if self.several and call.retry and timed_out and elapsed_s < FAILOVER_S:
            self.rotate()
            return error, 0.0
        if not may_retry(call, err):
            return error, None
        if self.several:
            self.rotate()
            if elapsed_s < FAILOVER_S:
                return error, BACKOFF[0]
            return error, None
        if attempt < RETRIES:
            return error, BACKOFF[min(attempt, len(BACKOFF) - 1)]
        return error, None


def normalize_target(endpoint: str | None) -> str:
    """``host:port`` for grpc from ``host:port`` or ``http://host:port[/]``."""
    target = (endpoint or DEFAULT_ENDPOINT).strip()
    for scheme in ("http://", "https://", "grpc://"):
        if target.startswith(scheme):
            target = target[len(scheme):]
            break
    return target.rstrip("/") or DEFAULT_ENDPOINT


def map_rpc_error(err: grpc.RpcError) -> QueueError:
    """The ``QueueError`` for a failed RPC (SQS code from trailing metadata when present)."""
    status = _status(err)
    details_fn = getattr(err, "details", None)
    details = (details_fn() if callable(details_fn) else None) or ""
    trailing_fn = getattr(err, "trailing_metadata", None)
    trailing = (trailing_fn() if callable(trailing_fn) else None) or ()
    for key, value in trailing:
        if key == ERROR_CODE_KEY:
            sqs_code = value.decode() if isinstance(value, bytes) else str(value)
            return error_for(sqs_code, details)
    name = status.name if isinstance(status, grpc.StatusCode) else str(status)
    text = f"gRPC {name}: {details}" if details else f"gRPC {name}"
    if status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return ServiceUnavailable(text)
    if status == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # gRPC's own message-size limit (the SQS OverLimit carries its code in the trailer):
        # over-size input is the caller's, as SQS answers a too-long message.
        return error_for("InvalidParameterValue", "The request is too large. Reason: Message "
                         f"must be shorter than 1048576 bytes. ({text})")
    return error_for("InternalError", text)


# Reconnect within a second of a server coming back: gRPC's default backoff grows to 120 s,
# and while it waits every call fails at once with "failed to connect".
CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000))


def _status(err: grpc.RpcError) -> grpc.StatusCode | None:
    code_fn = getattr(err, "code", None)
    return code_fn() if callable(code_fn) else None


def _unavailable(err: grpc.RpcError) -> bool:
    return _status(err) == grpc.StatusCode.UNAVAILABLE


def may_retry(call: Call, err: grpc.RpcError) -> bool:
    """UNAVAILABLE may be retried for a call that is safe to repeat, and for any call that
    never left this process (no connection: the server cannot have applied it) or that the
    server says it did not run (it was shutting down)."""
    if not _unavailable(err):
        return False
    if call.retry:
        return True
    details_fn = getattr(err, "details", None)
    details = (details_fn() if callable(details_fn) else None) or ""
    return never_sent(err) or NOT_RUN in details.lower()


# What gRPC says of a call that found no connection (refused, or a name that does not
# resolve), and what a stream says of the calls it ended before writing: nothing was sent.
NOTHING_SENT = "the stream ended before any call was sent"
_NOT_SENT = ("failed to connect", "errors resolving", "dns resolution failed", NOTHING_SENT)


def never_sent(err: grpc.RpcError) -> bool:
    """The call never reached a server: any call may be sent again, anywhere."""
    if not _unavailable(err):
        return False
    details_fn = getattr(err, "details", None)
    details = ((details_fn() if callable(details_fn) else None) or "").lower()
    return any(text in details for text in _NOT_SENT)
