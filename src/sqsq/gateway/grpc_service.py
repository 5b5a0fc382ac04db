"""The public gRPC service (sqsq.v1.Queues): protobuf in, ``QueueService`` call, protobuf out.

A queue URL or name becomes the queue's key in the caller's region: metadata ``sqsq-region``
(absent: the configured region), unless the URL names one. Errors become the gRPC status
from the error table, with the SQS error code in the trailing metadata key
``sqs-error-code`` so clients can raise the matching ``QueueError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from sqsq.api import QueueService
from sqsq.errors import from_rejection
from sqsq.gateway import logs
from sqsq.gateway.convert import (
    add_messages,
    add_sent,
    entry_from_pb,
    failed_to_pb,
    opt,
    sent_response,
)
from sqsq.gateway.grpc_calls import (
    GRPC_ACTIONS,
    KEY_CACHE_SIZE,
    STREAM_CALLS,
    about_call,
    caller_region,
    failure_of,
    relayed,
    rpc,
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
        """One call off a stream, through its unary method's body with what ``rpc`` wraps
        around it done here: the same logs, metrics and errors (``context.abort`` raises
        ``Aborted`` here). Its reply, serialized. (Through the wrapper, each call cost a
        coroutine more, resumed at every await, and each failure an abort raised and caught.)
        """
        action = STREAM_CALLS[kind]
        token = logs.bind(*about_call(request, action))
        metrics = self.metrics
        label = metrics.action_label(action)
        started = metrics.begin(label)
        code = ""
        try:
            response = await _BODIES[action](self, request, context)
        except Aborted as e:  # the method's own
            return e.reply(ERROR_CODE_KEY).SerializeToString()
        except Exception as e:  # noqa: BLE001 - every failure leaves with an SQS code
            status, code, message = failure_of(e, action)
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

    @rpc
    async def CreateQueue(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._named(context, request.queue_name)
        url = await api.create_queue(key, dict(request.attributes), dict(request.tags))
        return pb.CreateQueueResponse(queue_url=url)

    @rpc
    async def GetQueueUrl(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._named(context, request.queue_name)
        url = await api.get_queue_url(key)
        return pb.GetQueueUrlResponse(queue_url=url)

    @rpc
    async def ListQueues(self, request, context):  # noqa: ANN001, ANN201, N802
        api, prefix = self._named(context, request.queue_name_prefix)
        urls, token = await api.list_queues(prefix, opt(request, "max_results"),
                                            request.next_token)
        return pb.ListQueuesResponse(queue_urls=urls, next_token=token)

    @rpc
    async def DeleteQueue(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        await api.delete_queue(key)
        return pb.Empty()

    @rpc
    async def PurgeQueue(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        await api.purge_queue(key)
        return pb.Empty()

    @rpc
    async def GetQueueAttributes(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        attrs = await api.get_queue_attributes(key, list(request.attribute_names))
        return pb.GetQueueAttributesResponse(attributes=attrs)

    @rpc
    async def SetQueueAttributes(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        await api.set_queue_attributes(key, dict(request.attributes))
        return pb.Empty()

    @rpc
    async def TagQueue(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        await api.tag_queue(key, dict(request.tags))
        return pb.Empty()

    @rpc
    async def UntagQueue(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        await api.untag_queue(key, list(request.tag_keys))
        return pb.Empty()

    @rpc
    async def ListQueueTags(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        tags = await api.list_queue_tags(key)
        return pb.ListQueueTagsResponse(tags=tags)

    @rpc
    async def ListDeadLetterSourceQueues(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        urls = await api.list_dead_letter_source_queues(key)
        return pb.ListQueuesResponse(queue_urls=urls)

    @rpc
    async def SendMessage(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := relayed(api, "SendMessage", request, key)) is not None and \
                (passed := await through) is not None:
            return passed
        result = await api.send_message_batch(
            key, [entry_from_pb(request, "0")], request.request_id)
        if result.failed:
            raise from_rejection(result.failed[0].rejection)
        return sent_response(result.successful[0])

    @rpc
    async def SendMessageBatch(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := relayed(api, "SendMessageBatch", request, key)) is not None and \
                (passed := await through) is not None:
            return passed
        entries = [entry_from_pb(e, e.id) for e in request.entries]
        result = await api.send_message_batch(key, entries, request.request_id)
        response = pb.SendMessageBatchResponse()
        add_sent(response.successful, result.successful)
        if result.failed:
            response.failed.extend(failed_to_pb(result.failed))
        return response

    @rpc
    async def ReceiveMessage(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := relayed(api, "ReceiveMessage", request, key)) is not None and \
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

    @rpc
    async def DeleteMessage(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := relayed(api, "DeleteMessage", request, key)) is not None and \
                (passed := await through) is not None:
            return passed
        result = await api.delete_message_batch(key, [("0", request.receipt_handle)])
        if result.failed:
            raise from_rejection(result.failed[0].rejection)
        return pb.Empty()

    @rpc
    async def DeleteMessageBatch(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := relayed(api, "DeleteMessageBatch", request, key)) is not None and \
                (passed := await through) is not None:
            return passed
        result = await api.delete_message_batch(
            key, [(e.id, e.receipt_handle) for e in request.entries])
        return pb.BatchResponse(successful=list(result.successful),
                                failed=failed_to_pb(result.failed))

    @rpc
    async def ChangeMessageVisibility(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := relayed(api, "ChangeMessageVisibility", request, key)) is not None and \
                (passed := await through) is not None:
            return passed
        result = await api.change_message_visibility_batch(
            key, [("0", request.receipt_handle, request.visibility_timeout)])
        if result.failed:
            raise from_rejection(result.failed[0].rejection)
        return pb.Empty()

    @rpc
    async def ChangeMessageVisibilityBatch(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        if (through := relayed(api, "ChangeMessageVisibilityBatch", request, key)) is not None and \
                (passed := await through) is not None:
            return passed
        result = await api.change_message_visibility_batch(
            key,
            [(e.id, e.receipt_handle, e.visibility_timeout) for e in request.entries])
        return pb.BatchResponse(successful=list(result.successful),
                                failed=failed_to_pb(result.failed))


    # ---- dead-letter redrive ----
    @rpc
    async def StartMessageMoveTask(self, request, context):  # noqa: ANN001, ANN201, N802
        handle = await self.api_for(context).start_message_move_task(
            request.source_arn, request.destination_arn or None,
            opt(request, "max_number_of_messages_per_second"), request.task_stamp)
        return pb.StartMessageMoveTaskResponse(task_handle=handle)

    @rpc
    async def ListMessageMoveTasks(self, request, context):  # noqa: ANN001, ANN201, N802
        tasks = await self.api_for(context).list_message_move_tasks(request.source_arn,
                                                       opt(request, "max_results"))
        return pb.ListMessageMoveTasksResponse(results=[task_to_pb(t) for t in tasks])

    @rpc
    async def CancelMessageMoveTask(self, request, context):  # noqa: ANN001, ANN201, N802
        moved = await self.api_for(context).cancel_message_move_task(request.task_handle)
        return pb.CancelMessageMoveTaskResponse(approximate_number_of_messages_moved=moved)

    # ---- direct routing (a cluster's gateway) ----
    @rpc
    async def DescribeQueueRoute(self, request, context):  # noqa: ANN001, ANN201, N802
        api, key = self._queue(context, request.queue_url)
        describe = getattr(api, "describe_queue_route", None)
        if describe is None:  # one shard group, or a node: nothing to route, call here
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no direct routing here")
        return await describe(key)


# action -> the body of its handler (what ``rpc`` wraps), for calls off a stream
_BODIES = {name: getattr(QueuesService, name).__wrapped__ for name in STREAM_CALLS.values()}
