"""``QueueService`` over a node's gRPC API: what ``sqsq gateway --backend`` serves its fronts
from.

The gateway keeps no queue state. It forwards each call to the node, naming the queue by its
name and region (metadata ``sqsq-region``), retries UNAVAILABLE with bounded backoff where the
SDK would (reads, and sends, which carry a request id the shard deduplicates: the client's,
or one made here), and answers with its own queue URLs. Requests are built by the SDK's own
builders (``sqsq.client._ops``), so a call and its retry rule are written once; long polls
wait at the node within the call's deadline. A node that refuses the gateway's credentials
(or their absence) is reported once, in one line; callers get the node's own 403.
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
from sqsq.core import regions
from sqsq.errors import QueueError
from sqsq.gateway import convert
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import AUTH_REFUSALS

CALL_TIMEOUT_S = 30.0
REFUSALS = AUTH_REFUSALS  # what a locked node answers a caller it does not let in


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


def about(key: str, home: str, build: Callable[..., _call.Call], *args: Any) -> _call.Call:
    """``build(name, *args)``: a call about the queue ``key``, to a node, which is told the
    queue's name and region (even the configured one: the node need not share it)."""
    region, name = regions.split_key(key, home)
    return dataclasses.replace(build(name, *args), region=region)


def keys_in(urls: Iterable[str], region: str, home: str) -> list[str]:
    """The keys of queues a node answered with the URLs of, all in ``region``."""
    return [regions.queue_key(region, queue_name_of(u), home) for u in urls]


class ForwardingApi:
    """Every SQS action, answered by the node at ``target`` (``host:port`` of its gRPC API)."""

    def __init__(self, target: str, endpoint: Endpoint,
                 credentials: tuple[str, str] | None = None) -> None:
        self.target = target
        self.endpoint = endpoint
        # The SDK's client: its channel, call signing, retries and error mapping.
        self._client = AsyncClient(target, timeout=CALL_TIMEOUT_S, credentials=credentials,
                                   direct=False)
        self._refusal_told = False

    async def close(self) -> None:
        await self._client.close()

    async def _run(self, call: _call.Call, parse: Callable[[Any], Any] | None = None) -> Any:
        """The SDK's call, with the gateway's parse of the response (the SDK's by default)."""
        if parse is not None:
            call = dataclasses.replace(call, parse=parse)
        try:
            return await self._client._run(call)  # noqa: SLF001 - the SDK's own call path
        except QueueError as e:
            if e.code in REFUSALS:
                self._tell_refused(e)
            raise  # the node's own error: callers get its 403

    def _tell_refused(self, error: QueueError) -> None:
        if not self._refusal_told:
            self._refusal_told = True
            print(f"sqsq gateway: WARNING: the node at {self.target} refuses this gateway's "
                  f"calls ({error}): every call is answered 403. Give the gateway the node's "
                  "access key: SQSQ_ACCESS_KEY_ID and SQSQ_SECRET_ACCESS_KEY.", flush=True)

    async def probe(self) -> None:
        """One harmless call, so a node that refuses this gateway is reported at start-up (a
        node that does not answer yet is not: the first refused call will be)."""
        try:
            await self._run(_ops.list_queues_page("", 1))
        except QueueError:
            pass

    def _about(self, key: str, build: Callable[..., _call.Call], *args: Any) -> _call.Call:
        return about(key, self.endpoint.region, build, *args)

    # ---- queues ----
    async def create_queue(self, name: str, attributes: Mapping[str, str] | None = None,
                           tags: Mapping[str, str] | None = None) -> str:
        await self._run(self._about(name, _ops.create_queue, attributes, tags))
        return self.endpoint.queue_url(name)

    async def get_queue_url(self, name: str) -> str:
        await self._run(self._about(name, _ops.get_queue_url))
        return self.endpoint.queue_url(name)

    async def list_queues(self, prefix: str = "", max_results: int | None = None,
                          next_token: str = "") -> tuple[list[str], str]:
        region = regions.region_of(prefix, self.endpoint.region)
        return await self._run(
            self._about(prefix, _ops.list_queues_page, max_results, next_token),
            lambda r: ([self.endpoint.queue_url(k)
                        for k in keys_in(r.queue_urls, region, self.endpoint.region)],
                       r.next_token))

    async def delete_queue(self, queue: str) -> None:
        await self._run(self._about(queue, _ops.delete_queue))

    async def purge_queue(self, queue: str) -> None:
        await self._run(self._about(queue, _ops.purge_queue))

    async def get_queue_attributes(self, queue: str, names: list[str]) -> dict[str, str]:
        return await self._run(self._about(queue, _ops.get_queue_attributes, names))

    async def set_queue_attributes(self, queue: str, attributes: Mapping[str, str]) -> None:
        await self._run(self._about(queue, _ops.set_queue_attributes, attributes))

    async def tag_queue(self, queue: str, tags: Mapping[str, str]) -> None:
        await self._run(self._about(queue, _ops.tag_queue, tags))

    async def untag_queue(self, queue: str, keys: Iterable[str]) -> None:
        await self._run(self._about(queue, _ops.untag_queue, list(keys)))

    async def list_queue_tags(self, queue: str) -> dict[str, str]:
        return await self._run(self._about(queue, _ops.list_queue_tags))

    async def list_dead_letter_source_queues(self, queue: str) -> list[str]:
        urls = await self._run(self._about(queue, _ops.list_dead_letter_source_queues))
        # A dead-letter queue's sources are in its region (SQS requires it).
        region = regions.region_of(queue, self.endpoint.region)
        return [self.endpoint.queue_url(k)
                for k in keys_in(urls, region, self.endpoint.region)]

    # ---- dead-letter redrive (ARNs name their queue's region) ----
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
    async def send_message_batch(self, queue: str, entries: list[c.SendEntry],
                                 request_id: str = "") -> c.BatchResult:
        return await self._run(self._about(queue, send_batch_call, entries,
                                           request_id or str(uuid.uuid4())))

    async def receive_message(
        self, queue: str, max_number_of_messages: int | None = None,
        visibility_timeout: int | None = None, wait_time_seconds: int | None = None,
        attribute_names: Iterable[str] = (), message_attribute_names: Iterable[str] = (),
        receive_request_attempt_id: str = "",
    ) -> list[c.ReceivedMessage]:
        return await self._run(self._about(
            queue, receive_call, max_number_of_messages, visibility_timeout,
            wait_time_seconds, attribute_names, message_attribute_names,
            receive_request_attempt_id))

    async def delete_message_batch(self, queue: str,
                                   entries: list[tuple[str, str]]) -> c.BatchResult:
        return await self._run(
            self._about(queue, _ops.delete_message_batch, [
                {"Id": i, "ReceiptHandle": h} for i, h in entries]),
            BATCH_PARSE)

    async def change_message_visibility_batch(
        self, queue: str, entries: list[tuple[str, str, int]]
    ) -> c.BatchResult:
        return await self._run(
            self._about(queue, _ops.change_message_visibility_batch, [
                {"Id": i, "ReceiptHandle": h, "VisibilityTimeout": t} for i, h, t in entries]),
            BATCH_PARSE)
