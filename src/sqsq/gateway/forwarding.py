"""``QueueService`` over a node's gRPC API: what ``sqsq gateway`` serves its fronts from.

The gateway keeps no queue state. It resolves a queue to the node that holds it (today one
node: a static partition map with one shard, as in single-node mode), forwards the call,
retries UNAVAILABLE with bounded backoff, and answers with its own queue URLs. Sends carry a
request id (the client's, or one made here) so a retried send is deduplicated by the shard,
never doubled. Long polls wait at the node; the call's deadline covers the wait.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
import grpc.aio

from sqsq.client import _auth, _ops
from sqsq.core import commands as c
from sqsq.gateway import convert
from sqsq.gateway.api import Endpoint, queue_name_of
from sqsq.v1 import queues_pb2 as pb
from sqsq.v1 import queues_pb2_grpc as pb_grpc

CALL_TIMEOUT_S = 30.0
LONG_POLL_MARGIN_S = 10.0
BACKOFF_S = (0.05, 0.2, 0.5, 1.0)  # then give up: the client sees ServiceUnavailable


class ForwardingApi:
    """Every SQS action, answered by the node at ``target`` (``host:port`` of its gRPC API)."""

    def __init__(self, target: str, endpoint: Endpoint,
                 credentials: tuple[str, str] | None = None) -> None:
        self.endpoint = endpoint
        creds = _auth.resolve(credentials)
        self._channel = grpc.aio.insecure_channel(
            target, interceptors=[_auth.AioTokenInterceptor(creds)] if creds else None)
        self._stub = pb_grpc.QueuesStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method: str, request: Any, *, retry: bool = True,
                    timeout: float = CALL_TIMEOUT_S) -> Any:
        rpc: Callable[..., Awaitable[Any]] = getattr(self._stub, method)
        for attempt in range(len(BACKOFF_S) + 1):
            try:
                return await rpc(request, timeout=timeout)
            except grpc.RpcError as err:
                if retry and attempt < len(BACKOFF_S) and _ops.is_retryable(err):
                    await asyncio.sleep(BACKOFF_S[attempt])
                    continue
                raise _ops.map_rpc_error(err) from None
        raise AssertionError("unreachable")

    def _url(self, node_url: str) -> str:
        """The node's queue URL as this gateway's clients address it."""
        return self.endpoint.queue_url(queue_name_of(node_url))

    # ---- queues ----
    async def create_queue(self, name: str, attributes: Mapping[str, str] | None = None,
                           tags: Mapping[str, str] | None = None) -> str:
        r = await self._call("CreateQueue", pb.CreateQueueRequest(
            queue_name=name, attributes=dict(attributes or {}), tags=dict(tags or {})))
        return self._url(r.queue_url)

    async def get_queue_url(self, name: str) -> str:
        r = await self._call("GetQueueUrl", pb.GetQueueUrlRequest(queue_name=name))
        return self._url(r.queue_url)

    async def list_queues(self, prefix: str = "", max_results: int | None = None,
                          next_token: str = "") -> tuple[list[str], str]:
        req = pb.ListQueuesRequest(queue_name_prefix=prefix, next_token=next_token)
        if max_results is not None:
            req.max_results = max_results
        r = await self._call("ListQueues", req)
        return [self._url(u) for u in r.queue_urls], r.next_token

    async def delete_queue(self, queue_url: str) -> None:
        await self._call("DeleteQueue", pb.QueueRequest(queue_url=queue_name_of(queue_url)))

    async def purge_queue(self, queue_url: str) -> None:
        # Not retried: a purge that did land would answer PurgeQueueInProgress the second time.
        await self._call("PurgeQueue", pb.QueueRequest(queue_url=queue_name_of(queue_url)),
                         retry=False)

    async def get_queue_attributes(self, queue_url: str, names: list[str]) -> dict[str, str]:
        r = await self._call("GetQueueAttributes", pb.GetQueueAttributesRequest(
            queue_url=queue_name_of(queue_url), attribute_names=names))
        return dict(r.attributes)

    async def set_queue_attributes(self, queue_url: str, attributes: Mapping[str, str]) -> None:
        await self._call("SetQueueAttributes", pb.SetQueueAttributesRequest(
            queue_url=queue_name_of(queue_url), attributes=dict(attributes)))

    async def tag_queue(self, queue_url: str, tags: Mapping[str, str]) -> None:
        await self._call("TagQueue", pb.TagQueueRequest(queue_url=queue_name_of(queue_url),
                                                        tags=dict(tags)))

    async def untag_queue(self, queue_url: str, keys: Iterable[str]) -> None:
        await self._call("UntagQueue", pb.UntagQueueRequest(queue_url=queue_name_of(queue_url),
                                                            tag_keys=list(keys)))

    async def list_queue_tags(self, queue_url: str) -> dict[str, str]:
        r = await self._call("ListQueueTags", pb.QueueRequest(queue_url=queue_name_of(queue_url)))
        return dict(r.tags)

    async def list_dead_letter_source_queues(self, queue_url: str) -> list[str]:
        r = await self._call("ListDeadLetterSourceQueues",
                             pb.QueueRequest(queue_url=queue_name_of(queue_url)))
        return [self._url(u) for u in r.queue_urls]

    # ---- dead-letter redrive ----
    async def start_message_move_task(
        self, source_arn: str, destination_arn: str | None = None,
        max_number_of_messages_per_second: int | None = None,
    ) -> str:
        req = pb.StartMessageMoveTaskRequest(source_arn=source_arn,
                                             destination_arn=destination_arn or "")
        if max_number_of_messages_per_second is not None:
            req.max_number_of_messages_per_second = max_number_of_messages_per_second
        # Not retried: a task that did start would make the retry UnsupportedOperation.
        r = await self._call("StartMessageMoveTask", req, retry=False)
        return r.task_handle

    async def cancel_message_move_task(self, task_handle: str) -> int:
        r = await self._call("CancelMessageMoveTask",
                             pb.CancelMessageMoveTaskRequest(task_handle=task_handle))
        return r.approximate_number_of_messages_moved

    async def list_message_move_tasks(self, source_arn: str,
                                      max_results: int | None = None) -> list[dict]:
        req = pb.ListMessageMoveTasksRequest(source_arn=source_arn)
        if max_results is not None:
            req.max_results = max_results
        r = await self._call("ListMessageMoveTasks", req)
        return [_ops.move_task_from_pb(t) for t in r.results]

    # ---- messages ----
    async def send_message_batch(self, queue_url: str, entries: list[c.SendEntry],
                                 request_id: str = "") -> c.BatchResult:
        r = await self._call("SendMessageBatch", pb.SendMessageBatchRequest(
            queue_url=queue_name_of(queue_url), entries=[convert.entry_to_pb(e) for e in entries],
            request_id=request_id or str(uuid.uuid4())))
        return c.BatchResult(tuple(convert.sent_from_pb(s) for s in r.successful),
                             convert.failed_from_pb(r.failed))

    async def receive_message(
        self, queue_url: str, max_number_of_messages: int | None = None,
        visibility_timeout: int | None = None, wait_time_seconds: int | None = None,
        attribute_names: Iterable[str] = (), message_attribute_names: Iterable[str] = (),
        receive_request_attempt_id: str = "",
    ) -> list[c.ReceivedMessage]:
        req = pb.ReceiveMessageRequest(
            queue_url=queue_name_of(queue_url), attribute_names=list(attribute_names),
            message_attribute_names=list(message_attribute_names),
            receive_request_attempt_id=receive_request_attempt_id)
        for field, value in (("max_number_of_messages", max_number_of_messages),
                             ("visibility_timeout", visibility_timeout),
                             ("wait_time_seconds", wait_time_seconds)):
            if value is not None:
                setattr(req, field, value)
        wait = _ops.MAX_WAIT_SECONDS if wait_time_seconds is None else max(wait_time_seconds, 0)
        r = await self._call("ReceiveMessage", req, timeout=wait + LONG_POLL_MARGIN_S)
        return [convert.message_from_pb(m) for m in r.messages]

    async def delete_message_batch(self, queue_url: str,
                                   entries: list[tuple[str, str]]) -> c.BatchResult:
        r = await self._call("DeleteMessageBatch", pb.DeleteMessageBatchRequest(
            queue_url=queue_name_of(queue_url),
            entries=[pb.DeleteMessageBatchEntry(id=i, receipt_handle=h) for i, h in entries]))
        return convert.batch_from_pb(r)

    async def change_message_visibility_batch(
        self, queue_url: str, entries: list[tuple[str, str, int]]
    ) -> c.BatchResult:
        r = await self._call("ChangeMessageVisibilityBatch",
                             pb.ChangeMessageVisibilityBatchRequest(
                                 queue_url=queue_name_of(queue_url),
                                 entries=[pb.ChangeMessageVisibilityBatchEntry(
                                     id=i, receipt_handle=h, visibility_timeout=t)
                                     for i, h, t in entries]))
        return convert.batch_from_pb(r)
