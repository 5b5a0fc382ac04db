"""What every call of the public gRPC service goes through, whatever its RPC: the ``rpc``
wrapper (logs, metrics, an error as its gRPC status with the SQS code), the caller's region,
a call's request id and queue for its logs, and the names of the service's calls.
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import secrets
from collections.abc import Awaitable
from typing import Any

import grpc

from sqsq.api import REGION_METADATA_KEY, QueueService
from sqsq.core import regions
from sqsq.errors import ErrorCode, InvalidParameterValue, QueueError
from sqsq.gateway import logs
from sqsq.gateway.streaming import Aborted
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import ERROR_CODE_KEY

log = logging.getLogger("sqsq.gateway")
GRPC_ACTIONS = frozenset(pb.DESCRIPTOR.services_by_name["Queues"].methods_by_name)
# A call on the stream names its unary method in snake case (StreamRequest's oneof member).
STREAM_CALLS = {re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower(): name
                for name in pb.DESCRIPTOR.services_by_name["Queues"].methods_by_name
                if name != "Stream"}


KEY_CACHE_SIZE = 4096  # queue URLs whose key a service remembers


def caller_region(context: grpc.aio.ServicerContext) -> str | None:
    """The region the caller names in its metadata; None when it names none."""
    for key, value in context.invocation_metadata() or ():
        if key == REGION_METADATA_KEY:
            region = value if isinstance(value, str) else value.decode()
            if not regions.valid_region(region):
                raise InvalidParameterValue(f"Value {region} for {REGION_METADATA_KEY} is "
                                            "invalid. Reason: not a region name.")
            return region
    return None


def _status(code: ErrorCode) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, code.spec.grpc_status)


# A call without a request id of its own gets this process's random prefix and a count: as
# unique in the logs as a random UUID, without a syscall per receive and delete.
_ID_PREFIX = secrets.token_hex(8)
_ID_COUNT = itertools.count(1)


def about_call(request: object, action: str) -> tuple[str, str, str]:
    """A call's request id (the caller's, or a new one), action and queue, for its logs."""
    request_id_field, queue_field = _ABOUT_FIELDS.get(action, ("", ""))
    request_id = (getattr(request, request_id_field) if request_id_field else "") or \
        f"{_ID_PREFIX}{next(_ID_COUNT):016x}"
    queue = getattr(request, queue_field) if queue_field else ""
    return request_id, action, _queue_named(queue)


@functools.lru_cache(maxsize=KEY_CACHE_SIZE)  # a client names the same few queues
def _queue_named(queue: str) -> str:
    return queue.rstrip("/").rsplit("/", 1)[-1][:80]


def _about_fields(method: Any) -> tuple[str, str]:
    """The fields of a method's request that name its request id and its queue ("": none),
    looked up once: asking a protobuf message for a field it lacks raises (and costs)."""
    fields = method.input_type.fields_by_name
    queue = next((f for f in ("queue_url", "queue_name") if f in fields), "")
    return ("request_id" if "request_id" in fields else ""), queue


_ABOUT_FIELDS = {name: _about_fields(method) for name, method in
                 pb.DESCRIPTOR.services_by_name["Queues"].methods_by_name.items()}


def rpc(method):  # noqa: ANN001, ANN202 - a decorator over servicer methods
    action = method.__name__

    @functools.wraps(method)
    async def run(self, request, context):  # noqa: ANN001, ANN202
        token = logs.bind(*about_call(request, action))  # the request's line names it too
        metrics = self.metrics
        label = metrics.action_label(action)
        started = metrics.begin(label)  # (metrics.request's counting, without its objects)
        code = ""
        try:
            return await method(self, request, context)
        except Exception as e:  # noqa: BLE001 - every failure leaves with an SQS code
            if isinstance(e, (grpc.aio.AbortError, Aborted)):  # the method's own
                raise
            status, code, message = failure_of(e, action)
            await context.abort(status, message, trailing_metadata=((ERROR_CODE_KEY, code),))
        finally:
            metrics.end(label, "grpc", started, code)
            logs.unbind(token)

    return run


def failure_of(e: Exception, action: str) -> tuple[grpc.StatusCode, str, str]:
    """What a handler's exception ends its call with: the status, the SQS error code and
    the message (called in the ``except`` that caught it: an internal error is logged with
    its traceback)."""
    if isinstance(e, QueueError):
        return _status(e.error_code), e.code, e.message
    log.exception("internal error in %s", action)
    return grpc.StatusCode.INTERNAL, "InternalError", f"internal error: {e}"


def relayed(api: QueueService, method: str, request: Any, key: str) -> Awaitable[Any] | None:
    """A cluster gateway's answer to a message call for one shard, passed through to the
    shard as it came (``routing.pass_through``; awaited, None means decode and route it
    here); None at once, with no coroutine to run, for a service that passes nothing
    through (a node's shard)."""
    through = getattr(api, "pass_through", None)
    return None if through is None else through(method, request, key)
