"""The asyncio client: ``AsyncClient("127.0.0.1:7400")``, the same actions as coroutines."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import grpc
import grpc.aio

from sqsq.client import _auth, _call, _direct, _ops
from sqsq.client._routed import AsyncRouter
from sqsq.client.batching import AsyncBatcher, BatchSettings, resolve
from sqsq.client.prefetch import AsyncPrefetcher
from sqsq.client.receive_batching import ReceiveCoalescer
from sqsq.client.sync import DEFAULT_TIMEOUT
from sqsq.client.types import BatchResult, Message, MessageAttributes, SendResult
from sqsq.v1 import queues_pb2_grpc


def open_stub(target: str, creds: tuple[str, str] | None,
              ) -> tuple[grpc.aio.Channel, queues_pb2_grpc.QueuesStub]:
    """A channel to ``target`` and the Queues stub over it; with credentials, a signed token
    on every call (see sqsq.gateway.auth). The stub multiplexes its calls over one stream
    (``sqsq.client._stream``; env ``SQSQ_STREAM=0``: one unary RPC per call)."""
    from sqsq.client import _stream, _stubs

    channel = _auth.signed_aio_channel(target, creds)
    if _stream.enabled():
        stub = _stubs.AsyncStreamStub(channel, creds, target)
        return _stubs.AioChannel(channel, stub), stub  # type: ignore[return-value]
    return channel, queues_pb2_grpc.QueuesStub(channel)


class AsyncClient:
    """An asyncio sqsq client (grpc.aio); create it inside the running event loop.

    Errors are raised as ``sqsq.errors.QueueError`` subclasses carrying the SQS error code.
    ``credentials=(access_key_id, secret)`` (default: env ``SQSQ_ACCESS_KEY_ID`` and
    ``SQSQ_SECRET_ACCESS_KEY``, if both are set) signs every call for a server with auth on.
    ``region`` (default: env ``SQSQ_REGION``, else the server's) is the region whose queues
    the calls address: the same name in two regions is two queues.

    ``batching`` (default on) coalesces concurrent ``send_message``, ``delete_message`` and
    ``change_message_visibility`` calls to one queue into batch calls; a lone call still
    goes out alone, with no timer (at the end of the event loop's turn, with the same calls
    made in that turn), and each caller gets its own result or error
    (``sqsq.client.batching``).
    It also coalesces concurrent ``receive_message`` calls to one standard queue
    (``sqsq.client.receive_batching``).
    Pass a ``BatchSettings(max_entries=..., max_bytes=..., max_in_flight=..., receives=...)``
    to tune it, or ``batching=False`` for one RPC per call.

    ``direct`` (default on; env ``SQSQ_DIRECT=0`` turns it off): pointed at a cluster's
    gateway, the client sends its message calls straight to the shard leaders, and through
    the gateway whatever cannot go direct (``sqsq.client._direct``); ``routing_stats`` counts
    them. ``node_addresses`` maps a node's advertised address to the one this client reaches
    it at (NAT, published container ports).
    """

    def __init__(
        self, endpoint: str | None = None, *, timeout: float | None = DEFAULT_TIMEOUT,
        credentials: tuple[str, str] | None = None, region: str | None = None,
        batching: BatchSettings | bool | None = True, direct: bool | None = None,
        node_addresses: Mapping[str, str] | None = None,
    ):
        self.route = _call.Route(endpoint)
        self.timeout = timeout
        self.region = region or os.environ.get("SQSQ_REGION") or None
        self._creds = _auth.resolve(credentials)
        self._stubs: dict[str, tuple[grpc.aio.Channel, queues_pb2_grpc.QueuesStub]] = {}
        settings = resolve(batching)
        self._batcher = AsyncBatcher(self._run, settings) if settings else None
        self._receives = ReceiveCoalescer(self._run, self._make_visible, settings.max_in_flight) \
            if settings and settings.receives else None
        self._routes = _direct.Table(time.monotonic)
        self._router = AsyncRouter(self._routes, self._via_gateway, self._stub,
                                   lambda target: open_stub(target, self._creds),
                                   node_addresses) if _direct.enabled(direct) else None

    @property
    def target(self) -> str:
        return self.route.current

    @property
    def routing_stats(self) -> dict[str, int]:
        """Direct routing's counts: calls answered by a shard leader directly, calls (or
        parts) sent through the gateway instead, routes asked of the gateway."""
        return self._routes.stats.as_dict()

    def _stub(self) -> queues_pb2_grpc.QueuesStub:
        target = self.route.current
        if target not in self._stubs:
            self._stubs[target] = open_stub(target, self._creds)
        return self._stubs[target][1]

    async def close(self) -> None:
        """Close the channels (after the batch calls under way)."""
        if self._receives is not None:
            await self._receives.wait_idle()
        if self._batcher is not None:
            await self._batcher.wait_idle()
        if self._router is not None:  # first: its route watch calls the gateway
            await self._router.close()
        for channel, _ in self._stubs.values():
            await channel.close()
        self._stubs.clear()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncClient({self.target!r})"

    async def _run(self, call: _call.Call) -> Any:
        router = self._router
        if router is not None and not self._routes.off and call.method in _direct.MESSAGE_CALLS:
            try:
                return call.parse(await router.run(call, self.region,
                                                   call.timeout(self.timeout)))
            except _direct.Fallback as fallback:
                if fallback.counted:
                    self._routes.stats.fallbacks += 1
        return await self._via_gateway(call)

    async def _via_gateway(self, call: _call.Call) -> Any:
        """The call made at the endpoint the client was given (a gateway, a server)."""
        timeout = self.route.attempt_timeout(call, call.timeout(self.timeout))
        started = time.monotonic()
        attempt = 0
        while True:
            request = _call.attempt_request(call.request, attempt, started)
            try:
                method = getattr(self._stub(), call.method)
                return call.parse(await method(request, timeout=timeout,
                                               metadata=call.metadata(self.region)))
            except grpc.RpcError as err:
                error, delay = self.route.retry_after(call, err, attempt,
                                                      time.monotonic() - started)
                if delay is None:
                    raise error from None
                attempt += 1
                await asyncio.sleep(delay)

    async def _batched(self, queue: str, call: _call.Call) -> Any:
        """A single-message call, coalesced with concurrent ones when batching is on."""
        if self._batcher is None:
            return await self._run(call)
        return await self._batcher.call(queue, call)

    # -- queues ----------------------------------------------------------------------------

    async def create_queue(
        self,
        queue_name: str,
        attributes: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """Create a queue (or return the existing one with the same attributes); its URL."""
        return await self._run(_ops.create_queue(queue_name, attributes, tags))

    async def get_queue_url(
        self, queue_name: str, queue_owner_aws_account_id: str | None = None
    ) -> str:
        """The URL of a queue."""
        return await self._run(_ops.get_queue_url(queue_name, queue_owner_aws_account_id))

    async def list_queues(
        self,
        queue_name_prefix: str = "",
        max_results: int | None = None,
        next_token: str | None = None,
    ) -> list[str]:
        """Queue URLs (one page when ``max_results`` is given; see ``list_queues_page``)."""
        return await self._run(_ops.list_queues(queue_name_prefix, max_results, next_token))

    async def list_queues_page(
        self,
        queue_name_prefix: str = "",
        max_results: int | None = None,
        next_token: str | None = None,
    ) -> tuple[list[str], str | None]:
        """One page of queue URLs and the token of the next page (None on the last)."""
        return await self._run(_ops.list_queues_page(queue_name_prefix, max_results, next_token))

    async def delete_queue(self, queue: str) -> None:
        """Delete a queue and its messages."""
        await self._run(_ops.delete_queue(queue))

    async def purge_queue(self, queue: str) -> None:
        """Delete every message of a queue."""
        await self._run(_ops.purge_queue(queue))

    async def get_queue_attributes(
        self, queue: str, attribute_names: Iterable[str] | str = ("All",)
    ) -> dict[str, str]:
        """Queue attributes by name (``"All"`` for every one)."""
        return await self._run(_ops.get_queue_attributes(queue, attribute_names))

    async def set_queue_attributes(self, queue: str, attributes: Mapping[str, str]) -> None:
        """Change queue attributes."""
        await self._run(_ops.set_queue_attributes(queue, attributes))

    async def tag_queue(self, queue: str, tags: Mapping[str, str]) -> None:
        """Add or overwrite tags."""
        await self._run(_ops.tag_queue(queue, tags))

    async def untag_queue(self, queue: str, tag_keys: Iterable[str] | str) -> None:
        """Remove tags by key."""
        await self._run(_ops.untag_queue(queue, tag_keys))

    async def list_queue_tags(self, queue: str) -> dict[str, str]:
        """The queue's tags."""
        return await self._run(_ops.list_queue_tags(queue))

    async def list_dead_letter_source_queues(self, queue: str) -> list[str]:
        """URLs of the queues whose redrive policy targets this queue."""
        return await self._run(_ops.list_dead_letter_source_queues(queue))

    # -- messages --------------------------------------------------------------------------

    async def send_message(
        self,
        queue: str,
        message_body: str,
        delay_seconds: int | None = None,
        message_attributes: MessageAttributes | None = None,
        message_group_id: str | None = None,
        message_deduplication_id: str | None = None,
        message_system_attributes: MessageAttributes | None = None,
    ) -> SendResult:
        """Send one message; retried on UNAVAILABLE with one request id (never duplicated).
        Batched with concurrent sends to the queue (see ``batching``)."""
        return await self._batched(
            queue,
            _ops.send_message(
                queue, message_body, delay_seconds, message_attributes, message_group_id,
                message_deduplication_id, message_system_attributes,
            )
        )

    async def send_message_batch(
        self, queue: str, entries: Iterable[Mapping[str, Any]]
    ) -> BatchResult:
        """Send up to 10 boto3-shaped entries (``Id``, ``MessageBody``, ...)."""
        return await self._run(_ops.send_message_batch(queue, entries))

    async def receive_message(
        self,
        queue: str,
        max_number_of_messages: int = 1,
        visibility_timeout: int | None = None,
        wait_time_seconds: int | None = None,
        attribute_names: Iterable[str] | str | None = None,
        message_attribute_names: Iterable[str] | str | None = None,
        message_system_attribute_names: Iterable[str] | str | None = None,
        receive_request_attempt_id: str = "",
    ) -> list[Message]:
        """Receive up to ``max_number_of_messages`` (long polls ``wait_time_seconds``).
        Coalesced with concurrent receives from the queue (see ``batching``)."""
        call = _ops.receive_message(
            queue, max_number_of_messages, visibility_timeout, wait_time_seconds,
            attribute_names, message_attribute_names, message_system_attribute_names,
            receive_request_attempt_id,
        )
        if self._receives is None:
            return await self._run(call)
        return await self._receives.call(queue, call)

    async def _make_visible(self, queue: str, messages: list[Message]) -> None:
        """Messages received for a caller that is gone: visible to other consumers again.
        (If that fails, they come back when their visibility timeout ends.)"""
        await asyncio.gather(*(self.change_message_visibility(queue, m.receipt_handle, 0)
                               for m in messages), return_exceptions=True)

    async def delete_message(self, queue: str, receipt_handle: str) -> None:
        """Delete a received message by its latest receipt handle."""
        await self._batched(queue, _ops.delete_message(queue, receipt_handle))

    async def delete_message_batch(
        self, queue: str, entries: Iterable[Mapping[str, Any]]
    ) -> BatchResult:
        """Delete up to 10 entries ``{"Id", "ReceiptHandle"}``."""
        return await self._run(_ops.delete_message_batch(queue, entries))

    async def change_message_visibility(
        self, queue: str, receipt_handle: str, visibility_timeout: int
    ) -> None:
        """Set a received message's remaining visibility timeout (0: visible now)."""
        await self._batched(queue, _ops.change_message_visibility(queue, receipt_handle,
                                                                   visibility_timeout))

    async def change_message_visibility_batch(
        self, queue: str, entries: Iterable[Mapping[str, Any]]
    ) -> BatchResult:
        """Change up to 10 entries ``{"Id", "ReceiptHandle", "VisibilityTimeout"}``."""
        return await self._run(_ops.change_message_visibility_batch(queue, entries))

    def prefetcher(self, queue: str, buffer: int = 10, *,
                   visibility_timeout: int | None = None, **options: Any) -> AsyncPrefetcher:
        """A consumer that receives up to ``buffer`` messages ahead and hands them out one by
        one, never one whose visibility timeout (``visibility_timeout``, else the queue's) is
        about to run out; ``close()`` releases what it still holds. Options:
        ``wait_time_seconds``, ``safety_margin_s``, ``attribute_names``,
        ``message_attribute_names`` (see ``sqsq.client.prefetch``)."""
        return AsyncPrefetcher(self, queue, buffer=buffer,
                               visibility_timeout=visibility_timeout, **options)

    # -- dead-letter redrive ---------------------------------------------------------------

    async def start_message_move_task(
        self, source_arn: str, destination_arn: str | None = None,
        max_number_of_messages_per_second: int | None = None,
    ) -> str:
        """Move messages out of the dead-letter queue ``source_arn`` (to ``destination_arn``,
        else back to each message's source queue); the task handle."""
        return await self._run(_ops.start_message_move_task(
            source_arn, destination_arn, max_number_of_messages_per_second))

    async def list_message_move_tasks(
        self, source_arn: str, max_results: int | None = None
    ) -> list[dict[str, Any]]:
        """The newest move tasks of ``source_arn`` (boto3's shape), at most ``max_results``."""
        return await self._run(_ops.list_message_move_tasks(source_arn, max_results))

    async def cancel_message_move_task(self, task_handle: str) -> int:
        """Cancel a running move task; how many messages it had moved."""
        return await self._run(_ops.cancel_message_move_task(task_handle))
