"""``QueueService`` over a node's gRPC API: what ``sqsq gateway`` serves its fronts from.

The gateway keeps no queue state. It resolves a queue to the node that holds it (today one
node: a static partition map with one shard, as in single-node mode), forwards the call,
retries UNAVAILABLE with bounded backoff where the SDK would (reads, and sends, which carry a
request id the shard deduplicates: the client's, or one made here), and answers with its own
queue URLs. Requests are built by the SDK's own builders (``sqsq.client._ops``), so a call and
its retry rule are written once; long polls wait at the node within the call's deadline.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqsq.api import Endpoint, queue_name_of
from sqsq.client import _call, _ops
from sqsq.client.aio import AsyncClient
from sqsq.core import commands as c
from sqsq.gateway import convert
from sqsq.v1 import queues_pb2 as pb

CALL_TIMEOUT_S = 30.0


# -- calls in the core's own terms (the gateway's fronts speak them), shared with
#    ``gateway.cluster``

BATCH_PARSE = convert.batch_from_pb


def send_batch_call(queue: str, entries: list[c.SendEntry], request_id: str) -> _call.Call:
    """The entries are the core's already: converted directly, not through boto3's shape.
    Safe to repeat: the shard deduplicates by request id."""
    request = pb.SendMessageBatchRequest(
        queue_url=queue, entries=[convert.entry_to_pb(e) for e in entries],
        request_id=request_id)
    return _call.Call("SendMessageBatch", request, lambda r: c.BatchResult(
        tuple(convert.sent_from_pb(s) for s in r.successful),
        convert.failed_from_pb(r.failed)), retry=True)


def receive_call(queue: str, max_number_of_messages: int | None,
                 visibility_timeout: int | None, wait_time_seconds: int | None,
                 attribute_names: Iterable[str], message_attribute_names: Iterable[str],
                 receive_request_attempt_id: str) -> _call.Call:
    call = _ops.receive_message(queue, max_number_of_messages, visibility_timeout,
                                wait_time_seconds, list(attribute_names),
                                list(message_attribute_names),
                                receive_request_attempt_id=receive_request_attempt_id)
    return dataclasses.replace(
        call, parse=lambda r: [convert.message_from_pb(m) for m in r.messages])


def batch_call(call: _call.Call) -> _call.Call:
    """A delete or visibility batch answering with the core's ``BatchResult``."""
    return dataclasses.replace(call, parse=BATCH_PARSE)


class ForwardingApi:
    """Every SQS action, answered by the node at ``target`` (``host:port`` of its gRPC API)."""

    def __init__(self, target: str, endpoint: Endpoint,
                 credentials: tuple[str, str] | None = None) -> None:
        self.endpoint = endpoint
        # The SDK's client: its channel, call signing, retries and error mapping.
        self._client = AsyncClient(target, timeout=CALL_TIMEOUT_S, credentials=credentials)

    async def close(self) -> None:
        await self._client.close()

    async def _run(self, call: _call.Call, parse: Callable[[Any], Any] | None = None) -> Any:
        """The SDK's call, with the gateway's parse of the response (the SDK's by default)."""
        if parse is not None:
            call = dataclasses.replace(call, parse=parse)
        return await self._client._run(call)  # noqa: SLF001 - the SDK's own call path

    def _url(self, node_url: str) -> str:
        """The node's queue URL as this gateway's clients address it."""
        return self.endpoint.queue_url(queue_name_of(node_url))

    # ---- queues ----
    async def create_queue(self, name: str, attributes: Mapping[str, str] | None = None,
                           tags: Mapping[str, str] | None = None) -> str:
        return self._url(await self._run(_ops.create_queue(name, attributes, tags)))

    async def get_queue_url(self, name: str) -> str:
        return self._url(await self._run(_ops.get_queue_url(name)))

    async def list_queues(self, prefix: str = "", max_results: int | None = None,
                          next_token: str = "") -> tuple[list[str], str]:
        return await self._run(
            _ops.list_queues_page(prefix, max_results, next_token),
            lambda r: ([self._url(u) for u in r.queue_urls], r.next_token))

    async def delete_queue(self, queue_url: str) -> None:
        await self._run(_ops.delete_queue(queue_name_of(queue_url)))

    async def purge_queue(self, queue_url: str) -> None:
        await self._run(_ops.purge_queue(queue_name_of(queue_url)))

    async def get_queue_attributes(self, queue_url: str, names: list[str]) -> dict[str, str]:
        return await self._run(_ops.get_queue_attributes(queue_name_of(queue_url), names))

    async def set_queue_attributes(self, queue_url: str, attributes: Mapping[str, str]) -> None:
        await self._run(_ops.set_queue_attributes(queue_name_of(queue_url), attributes))

    async def tag_queue(self, queue_url: str, tags: Mapping[str, str]) -> None:
        await self._run(_ops.tag_queue(queue_name_of(queue_url), tags))

    async def untag_queue(self, queue_url: str, keys: Iterable[str]) -> None:
        await self._run(_ops.untag_queue(queue_name_of(queue_url), list(keys)))

    async def list_queue_tags(self, queue_url: str) -> dict[str, str]:
        return await self._run(_ops.list_queue_tags(queue_name_of(queue_url)))

    async def list_dead_letter_source_queues(self, queue_url: str) -> list[str]:
        urls = await self._run(_ops.list_dead_letter_source_queues(queue_name_of(queue_url)))
        return [self._url(u) for u in urls]

    # ---- dead-letter redrive ----
    async def start_message_move_task(
        self, source_arn: str, destination_arn: str | None = None,
        max_number_of_messages_per_second: int | None = None, task_stamp: str = "",
    ) -> str:
        return await self._run(_ops.start_message_move_task(
            source_arn, destination_arn, max_number_of_messages_per_second, task_stamp))

    async def cancel_message_move_task(self, task_handle: str) -> int:
        return await self._run(_ops.cancel_message_move_task(task_handle))

    async def list_message_move_tasks(self, source_arn: str,
                                      max_results: int | None = None) -> list[dict]:
        return await self._run(_ops.list_message_move_tasks(source_arn, max_results))

    # ---- messages ----
    async def send_message_batch(self, queue_url: str, entries: list[c.SendEntry],
                                 request_id: str = "") -> c.BatchResult:
        return await self._run(send_batch_call(queue_name_of(queue_url), entries,
                                               request_id or str(uuid.uuid4())))

    async def receive_message(
        self, queue_url: str, max_number_of_messages: int | None = None,
        visibility_timeout: int | None = None, wait_time_seconds: int | None = None,
        attribute_names: Iterable[str] = (), message_attribute_names: Iterable[str] = (),
        receive_request_attempt_id: str = "",
    ) -> list[c.ReceivedMessage]:
        return await self._run(receive_call(
            queue_name_of(queue_url), max_number_of_messages, visibility_timeout,
            wait_time_seconds, attribute_names, message_attribute_names,
            receive_request_attempt_id))

    async def delete_message_batch(self, queue_url: str,
                                   entries: list[tuple[str, str]]) -> c.BatchResult:
        return await self._run(
            _ops.delete_message_batch(queue_name_of(queue_url), [
                {"Id": i, "ReceiptHandle": h} for i, h in entries]),
            BATCH_PARSE)

    async def change_message_visibility_batch(
        self, queue_url: str, entries: list[tuple[str, str, int]]
    ) -> c.BatchResult:
        return await self._run(
            _ops.change_message_visibility_batch(queue_name_of(queue_url), [
                {"Id": i, "ReceiptHandle": h, "VisibilityTimeout": t} for i, h, t in entries]),
            BATCH_PARSE)
