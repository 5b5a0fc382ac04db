"""One RPC as data (``Call``), and what every caller of it shares: the target address, the
channel options, which failures may be retried and how a failure becomes a ``QueueError``.
Used by ``Client``, ``AsyncClient`` and the gateway's forwarding backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from sqsq.errors import QueueError, ServiceUnavailable, error_for
from sqsq.gateway.auth import ERROR_CODE_KEY  # where the server puts the SQS error code

DEFAULT_ENDPOINT = "127.0.0.1:7400"
MAX_WAIT_SECONDS = 20  # SQS's longest long poll; the default when the queue decides
RECEIVE_DEADLINE_MARGIN = 10.0
RETRIES = 3  # retries after the first attempt, UNAVAILABLE only
BACKOFF = (0.1, 0.3, 0.9)


@dataclass(frozen=True)
class Call:
    """One RPC to make: ``method`` names the stub attribute."""

    method: str
    request: Any
    parse: Callable[[Any], Any]
    retry: bool = False  # safe to repeat on UNAVAILABLE (read-only or idempotent by request id)
    min_timeout: float | None = None  # the deadline must be at least this (long polls)

    def timeout(self, default: float | None) -> float | None:
        if self.min_timeout is None:
            return default
        if default is None:
            return None
        return max(default, self.min_timeout)


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
    code_fn = getattr(err, "code", None)
    status = code_fn() if callable(code_fn) else None
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


def _unavailable(err: grpc.RpcError) -> bool:
    code_fn = getattr(err, "code", None)
    return callable(code_fn) and code_fn() == grpc.StatusCode.UNAVAILABLE


def may_retry(call: Call, err: grpc.RpcError) -> bool:
    """UNAVAILABLE may be retried for a call that is safe to repeat, and for any call that
    never left this process (no connection: the server cannot have applied it)."""
    if not _unavailable(err):
        return False
    if call.retry:
        return True
    details_fn = getattr(err, "details", None)
    details = (details_fn() if callable(details_fn) else None) or ""
    return "failed to connect" in details.lower()
