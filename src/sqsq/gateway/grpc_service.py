"""The public gRPC service (sqsq.v1.Queues): protobuf in, ``QueueService`` call, protobuf out.

A queue URL or name becomes the queue's key in the caller's region: metadata ``sqsq-region``
(absent: the configured region), unless the URL names one. Errors become the gRPC status
from the error table, with the SQS error code in the trailing metadata key
``sqs-error-code`` so clients can raise the matching ``QueueError``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from sqsq.api import REGION_METADATA_KEY, QueueService
from sqsq.core import regions
from sqsq.core.errors import ErrorCode
from sqsq.errors import InvalidParameterValue, QueueError, from_rejection
from sqsq.gateway import logs
from sqsq.gateway.convert import (
    add_messages,
    add_sent,
    entry_from_pb,
    failed_to_pb,
    opt,
    sent_response,
)
from sqsq.gateway.metrics import ApiMetrics
from sqsq.gateway.streaming import (
    Aborted,
    CallContext,
    Metadata,
    StreamSession,
    error_reply,
    result_bytes,
)
from sqsq.v1 import queues_pb2 as pb
from sqsq.v1 import queues_pb2_grpc as pb_grpc
from sqsq.wire import ERROR_CODE_KEY, NOT_RUN, task_to_pb

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


def _about(request: object, action: str) -> tuple[str, str, str]:
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


def _rpc(method):  # noqa: ANN001, ANN202 - a decorator over servicer methods
    action = method.__name__

    @functools.wraps(method)
    async def run(self, request, context):  # noqa: ANN001, ANN202
        token = logs.bind(*_about(request, action))  # the request's line names it too
        metrics = self.metrics
        label = metrics.action_label(action)
        started = metrics.begin(label)  # (metrics.request's counting, without its objects)
        code = ""
        try:
            return await method(self, request, context)
        except Exception as e:  # noqa: BLE001 - every failure leaves with an SQS code
            if isinstance(e, (grpc.aio.AbortError, Aborted)):  # the method's own
                raise
            status, code, message = _failure(e, action)
            await context.abort(status, message, trailing_metadata=((ERROR_CODE_KEY, code),))
        finally:
            metrics.end(label, "grpc", started, code)
            logs.unbind(token)

    return run


def _failure(e: Exception, action: str) -> tuple[grpc.StatusCode, str, str]:
    """What a handler's exception ends its call with: the status, the SQS error code and
    the message (called in the ``except`` that caught it: an internal error is logged with
    its traceback)."""
    if isinstance(e, QueueError):
        return _status(e.error_code), e.code, e.message
    log.exception("internal error in %s", action)
    return grpc.StatusCode.INTERNAL, "InternalError", f"internal error: {e}"


def _passed(api: QueueService, method: str, request: Any, key: str) -> Awaitable[Any] | None:
    """A cluster gateway's answer to a message call for one shard, passed through to the
    shard as it came (``routing.pass_through``; awaited, None means decode and route it
    here); None at once, with no coroutine to run, for a service that passes nothing
    through (a node's shard)."""
    through = getattr(api, "pass_through", None)
    return None if through is None else through(method, request, key)


class QueuesService(pb_grpc.QueuesServicer):
    """Over one ``QueueService``; or, on a node hosting several shards, over the one
    ``select`` picks for each call (by the shard the caller names in its metadata)."""

    def __init__(self, api: QueueService | None = None, *,
                 select: Callable[[grpc.aio.ServicerContext], QueueService] | None = None,
                 metrics: ApiMetrics | None = None) -> None:
        if (api is None) == (select is None):
            raise ValueError("one of api and select")
        self.api = api
        self._select = select
        self._streams: set[StreamSession] = set()
        self._draining = False
        # The Stream call's headers: where this server's frame connection listens, if it has
        # one (``sqsq.gateway.frames``; set once it is bound).
        self.frame_offer: tuple[tuple[str, str], ...] = ()
        self.metrics = metrics or ApiMetrics(CollectorRegistry(), GRPC_ACTIONS)
        self._keys: dict[tuple[str, str | None, Any], str] = {}  # (URL, region, endpoint)

    async def Stream(self, request_iterator, context):  # noqa: ANN001, ANN201, N802
        if self._draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"The server is shutting down; {NOT_RUN}.")
        # Accepted: the client writes its calls only after these headers, so a stream refused
        # as it opens (credentials, draining) ends before any write can cross the refusal
        # (gRPC's asyncio client would report such a write as INTERNAL, not the refusal).
        await context.send_initial_metadata(self.frame_offer)
        session = self.open_session(context.invocation_metadata() or ())
        try:
            async for reply in session.replies(request_iterator):
                yield reply
        finally:
            self.close_session(session)

    @property
    def draining(self) -> bool:
        return self._draining

    def open_session(self, metadata: Metadata) -> StreamSession:
        """A stream's session (gRPC's, or a frame connection's), drained with the others."""
        session = StreamSession(self._stream_call, metadata)
        self._streams.add(session)
        return session

    def close_session(self, session: StreamSession) -> None:
        self._streams.discard(session)

    def drain_streams(self) -> None:
        """Shutting down: open streams finish the calls under way and end; no new ones."""
        self._draining = True
        for session in self._streams:
            session.drain()

    async def _stream_call(self, kind: str, request: Any, context: CallContext) -> bytes:
        """One call off a stream, through its unary method's body with what ``_rpc`` wraps
        around it done here: the same logs, metrics and errors (``context.abort`` raises
        ``Aborted`` here). Its reply, serialized. (Through the wrapper, each call cost a
        coroutine more, resumed at every await, and each failure an abort raised and caught.)
        """
        action = STREAM_CALLS[kind]
        token = logs.bind(*_about(request, action))
        metrics = self.metrics
        label = metrics.action_label(action)
        started = metrics.begin(label)
        code = ""
        try:
            response = await _BODIES[action](self, request, context)
        except Aborted as e:  # the method's own
            return e.reply(ERROR_CODE_KEY).SerializeToString()
        except Exception as e:  # noqa: BLE001 - every failure leaves with an SQS code
            status, code, message = _failure(e, action)
            return error_reply(status, code, message).SerializeToString()
        finally:
            metrics.end(label, "grpc", started, code)
            logs.unbind(token)
        return result_bytes(kind, response)

    def api_for(self, context: grpc.aio.ServicerContext) -> QueueService:
        return self.api if self._select is None else self._select(context)

    def _queue(self, context: grpc.aio.ServicerContext,
               queue_url: str) -> tuple[QueueService, str]:
        """The service for this call and the key of the queue ``queue_url`` names."""
        api = self.api_for(context)
        region = caller_region(context)
        # A URL's key is a pure function of the URL, the region and the endpoint; a client
        # names the same few queues call after call, so it is worked out once (a bounded
        # cache, emptied when full).
        found = self._keys.get((queue_url, region, api.endpoint))
        if found is None:
            if len(self._keys) >= KEY_CACHE_SIZE:
                self._keys.clear()
            found = self._keys[(queue_url, region, api.endpoint)] = api.endpoint.queue_key(
                queue_url, region)
        return api, found

    def _named(self, context: grpc.aio.ServicerContext, name: str) -> tuple[QueueService, str]:
        """The service for this call and the key of the queue (or prefix) ``name``."""
        api = self.api_for(context)
        return api, api.endpoint.named_key(name, caller_region(context))

    @_rpc
    async def CreateQueue(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._named(context, request.queue_name)
        url = await api.create_queue(key, dict(request.attributes), dict(request.tags))
        return pb.CreateQueueResponse(queue_url=url)

    @_rpc
    async def GetQueueUrl(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._named(context, request.queue_name)
        url = await api.get_queue_url(key)
        return pb.GetQueueUrlResponse(queue_url=url)

    @_rpc
    async def ListQueues(self, request, context):  # noqa: ANN001, ANN201, N802
        api, prefix = self._named(context, request.queue_name_prefix)
        urls, token = await api.list_queues(prefix, opt(request, "max_results"),
                                            request.next_token)
        return pb.ListQueuesResponse(queue_urls=urls, next_token=token)

    @_rpc
    async def DeleteQueue(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        await api.delete_queue(key)
        return pb.Empty()

    @_rpc
    async def PurgeQueue(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        await api.purge_queue(key)
        return pb.Empty()

    @_rpc
    async def GetQueueAttributes(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        attrs = await api.get_queue_attributes(key, list(request.attribute_names))
        return pb.GetQueueAttributesResponse(attributes=attrs)

    @_rpc
    async def SetQueueAttributes(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        await api.set_queue_attributes(key, dict(request.attributes))
        return pb.Empty()

    @_rpc
    async def TagQueue(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        await api.tag_queue(key, dict(request.tags))
        return pb.Empty()

    @_rpc
    async def UntagQueue(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        await api.untag_queue(key, list(request.tag_keys))
        return pb.Empty()

    @_rpc
    async def ListQueueTags(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        tags = await api.list_queue_tags(key)
        return pb.ListQueueTagsResponse(tags=tags)

    @_rpc
    async def ListDeadLetterSourceQueues(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        urls = await api.list_dead_letter_source_queues(key)
        return pb.ListQueuesResponse(queue_urls=urls)

    @_rpc
    async def SendMessage(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := _passed(api, "SendMessage", request, key)) is not None and \
                (passed := await through) is not None:
            return passed
        result = await api.send_message_batch(
            key, [entry_from_pb(request, "0")], request.request_id)
        if result.failed:
            raise from_rejection(result.failed[0].rejection)
        return sent_response(result.successful[0])

    @_rpc
    async def SendMessageBatch(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := _passed(api, "SendMessageBatch", request, key)) is not None and \
                (passed := await through) is not None:
            return passed
        entries = [entry_from_pb(e, e.id) for e in request.entries]
        result = await api.send_message_batch(key, entries, request.request_id)
        response = pb.SendMessageBatchResponse()
        add_sent(response.successful, result.successful)
        if result.failed:
            response.failed.extend(failed_to_pb(result.failed))
        return response

    @_rpc
    async def ReceiveMessage(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := _passed(api, "ReceiveMessage", request, key)) is not None and \
                (passed := await through) is not None:
            return passed
        messages = await api.receive_message(
            key,
            opt(request, "max_number_of_messages"),
            opt(request, "visibility_timeout"),
            opt(request, "wait_time_seconds"),
            list(request.attribute_names),
            list(request.message_attribute_names),
            request.receive_request_attempt_id,
        )
        response = pb.ReceiveMessageResponse()
        add_messages(response.messages, messages)
        return response

    @_rpc
    async def DeleteMessage(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := _passed(api, "DeleteMessage", request, key)) is not None and \
                (passed := await through) is not None:
            return passed
        result = await api.delete_message_batch(key, [("0", request.receipt_handle)])
        if result.failed:
            raise from_rejection(result.failed[0].rejection)
        return pb.Empty()

    @_rpc
    async def DeleteMessageBatch(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := _passed(api, "DeleteMessageBatch", request, key)) is not None and \
                (passed := await through) is not None:
            return passed
        result = await api.delete_message_batch(
            key, [(e.id, e.receipt_handle) for e in request.entries])
        return pb.BatchResponse(successful=list(result.successful),
                                failed=failed_to_pb(result.failed))

    @_rpc
    async def ChangeMessageVisibility(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := _passed(api, "ChangeMessageVisibility", request, key)) is not None and \
                (passed := await through) is not None:
            return passed
        result = await api.change_message_visibility_batch(
            key, [("0", request.receipt_handle, request.visibility_timeout)])
        if result.failed:
            raise from_rejection(result.failed[0].rejection)
        return pb.Empty()

    @_rpc
    async def ChangeMessageVisibilityBatch(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := _passed(api, "ChangeMessageVisibilityBatch", request, key)) is not None and \
                (passed := await through) is not None:
            return passed
        result = await api.change_message_visibility_batch(
            key,
            [(e.id, e.receipt_handle, e.visibility_timeout) for e in request.entries])
        return pb.BatchResponse(successful=list(result.successful),
                                failed=failed_to_pb(result.failed))


    # ---- dead-letter redrive ----
    @_rpc
    async def StartMessageMoveTask(self, request, context):  # noqa: ANN001, ANN201, N802
        handle = await self.api_for(context).start_message_move_task(
            request.source_arn, request.destination_arn or None,
            opt(request, "max_number_of_messages_per_second"), request.task_stamp)
        return pb.StartMessageMoveTaskResponse(task_handle=handle)

    @_rpc
    async def ListMessageMoveTasks(self, request, context):  # noqa: ANN001, ANN201, N802
        tasks = await self.api_for(context).list_message_move_tasks(request.source_arn,
                                                       opt(request, "max_results"))
        return pb.ListMessageMoveTasksResponse(results=[task_to_pb(t) for t in tasks])

    @_rpc
    async def CancelMessageMoveTask(self, request, context):  # noqa: ANN001, ANN201, N802
        moved = await self.api_for(context).cancel_message_move_task(request.task_handle)
        return pb.CancelMessageMoveTaskResponse(approximate_number_of_messages_moved=moved)

    # ---- direct routing (a cluster's gateway) ----
    @_rpc
    async def DescribeQueueRoute(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        describe = getattr(api, "describe_queue_route", None)
        if describe is None:  # one shard group, or a node: nothing to route, call here
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no direct routing here")
        return await describe(key)


# action -> the body of its handler (what ``_rpc`` wraps), for calls off a stream
_BODIES = {name: getattr(QueuesService, name).__wrapped__ for name in STREAM_CALLS.values()}
