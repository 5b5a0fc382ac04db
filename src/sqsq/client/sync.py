"""The blocking client: ``Client("127.0.0.1:7400")``, one grpc channel, SQS's actions."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import grpc

from sqsq.client import _auth, _call, _direct, _ops, _stubs
from sqsq.client._routed_sync import SyncRouter
from sqsq.client.batching import Batcher, BatchSettings, resolve
from sqsq.client.prefetch import Prefetcher
from sqsq.client.receive_batching_sync import ThreadReceiveCoalescer
from sqsq.client.types import BatchResult, Message, MessageAttributes, SendResult
from sqsq.v1 import queues_pb2_grpc

DEFAULT_TIMEOUT = 30.0


class Client:
    """A synchronous sqsq client. Queues are named by name or URL (``queue``).

    Errors are raised as ``sqsq.errors.QueueError`` subclasses carrying the SQS error code.
    ``credentials=(access_key_id, secret)`` (default: env ``SQSQ_ACCESS_KEY_ID`` and
    ``SQSQ_SECRET_ACCESS_KEY``, if both are set) signs every call for a server with auth on.
    ``region`` (default: env ``SQSQ_REGION``, else the server's) is the region whose queues
    the calls address: the same name in two regions is two queues.

    ``batching`` (default on) coalesces concurrent ``send_message``, ``delete_message`` and
    ``change_message_visibility`` calls to one queue into batch calls; a lone call still
    goes out at once, and each caller gets its own result or error (``sqsq.client.batching``).
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
        self._stubs: dict[str, tuple[grpc.Channel, queues_pb2_grpc.QueuesStub]] = {}
        settings = resolve(batching)
        self._batcher = Batcher(self._run, settings) if settings else None
        self._receives = ThreadReceiveCoalescer(self._run, settings.max_in_flight) \
            if settings and settings.receives else None
        self._routes = _direct.Table(time.monotonic)
        self._router = SyncRouter(self._routes, self._via_gateway, self._stub, self._open,
                                  node_addresses) if _direct.enabled(direct) else None

    @property
    def target(self) -> str:
        return self.route.current

    @property
    def routing_stats(self) -> dict[str, int]:
        """Direct routing's counts: calls answered by a shard leader directly, calls (or
        parts) sent through the gateway instead, routes asked of the gateway."""
        return self._routes.stats.as_dict()

    def _open(self, target: str) -> tuple[grpc.Channel, queues_pb2_grpc.QueuesStub]:
        from sqsq.client import _stream

        channel = _auth.signed_channel(target, self._creds)
        # Calls multiplexed over one stream (env SQSQ_STREAM=0: one unary RPC per call).
        stub = _stubs.StreamStub(channel, self._creds, target) if _stream.enabled() \
            else queues_pb2_grpc.QueuesStub(channel)
        return channel, stub  # type: ignore[return-value]

    def _stub(self) -> queues_pb2_grpc.QueuesStub:
        target = self.route.current
        if target not in self._stubs:
            self._stubs[target] = self._open(target)
        return self._stubs[target][1]

    def close(self) -> None:
        """Close the channels (and the stubs' frame connections)."""
        if self._router is not None:  # first: its route watch calls the gateway
            self._router.close()
        _stubs.close_all(self._stubs)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.target!r})"

    def _run(self, call: _call.Call) -> Any:
        router = self._router
        if router is not None and not self._routes.off and call.method in _direct.MESSAGE_CALLS:
            try:
                return call.parse(router.run(call, self.region, call.timeout(self.timeout)))
            except _direct.Fallback as fallback:
                if fallback.counted:
                    self._routes.stats.fallbacks += 1
                if fallback.request is not None:
                    call = dataclasses.replace(call, request=fallback.request)
        return self._via_gateway(call)

    def _via_gateway(self, call: _call.Call) -> Any:
        """The call made at the endpoint the client was given (a gateway, a server)."""
        timeout = self.route.attempt_timeout(call, call.timeout(self.timeout))
        started = time.monotonic()
        attempt = 0
        while True:
            request = _call.attempt_request(call.request, attempt, started)
            try:
                method = getattr(self._stub(), call.method)
                return call.parse(method(request, timeout=timeout,
                                         metadata=call.metadata(self.region)))
            except grpc.RpcError as err:
                error, delay = self.route.retry_after(call, err, attempt,
                                                      time.monotonic() - started)
                if delay is None:
                    raise error from None
                attempt += 1
                time.sleep(delay)

    def _batched(self, queue: str, call: _call.Call) -> Any:
        """A single-message call, coalesced with concurrent ones when batching is on."""
        if self._batcher is None:
            return self._run(call)
        return self._batcher.call(queue, call)

    # -- queues ----------------------------------------------------------------------------

    def create_queue(
        self,
        queue_name: str,
        attributes: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """Create a queue (or return the existing one with the same attributes); its URL."""
        return self._run(_ops.create_queue(queue_name, attributes, tags))

    def get_queue_url(self, queue_name: str, queue_owner_aws_account_id: str | None = None) -> str:
        """The URL of a queue."""
        return self._run(_ops.get_queue_url(queue_name, queue_owner_aws_account_id))

    def list_queues(
        self,
        queue_name_prefix: str = "",
        max_results: int | None = None,
        next_token: str | None = None,
    ) -> list[str]:
        """Queue URLs (one page when ``max_results`` is given; see ``list_queues_page``)."""
        return self._run(_ops.list_queues(queue_name_prefix, max_results, next_token))

    def list_queues_page(
        self,
        queue_name_prefix: str = "",
        max_results: int | None = None,
        next_token: str | None = None,
    ) -> tuple[list[str], str | None]:
        """One page of queue URLs and the token of the next page (None on the last)."""
        return self._run(_ops.list_queues_page(queue_name_prefix, max_results, next_token))

    def delete_queue(self, queue: str) -> None:
        """Delete a queue and its messages."""
        self._run(_ops.delete_queue(queue))

    def purge_queue(self, queue: str) -> None:
        """Delete every message of a queue."""
        self._run(_ops.purge_queue(queue))

    def get_queue_attributes(
        self, queue: str, attribute_names: Iterable[str] | str = ("All",)
    ) -> dict[str, str]:
        """Queue attributes by name (``"All"`` for every one)."""
        return self._run(_ops.get_queue_attributes(queue, attribute_names))

    def set_queue_attributes(self, queue: str, attributes: Mapping[str, str]) -> None:
        """Change queue attributes."""
        self._run(_ops.set_queue_attributes(queue, attributes))

    def tag_queue(self, queue: str, tags: Mapping[str, str]) -> None:
        """Add or overwrite tags."""
        self._run(_ops.tag_queue(queue, tags))

    def untag_queue(self, queue: str, tag_keys: Iterable[str] | str) -> None:
        """Remove tags by key."""
        self._run(_ops.untag_queue(queue, tag_keys))

    def list_queue_tags(self, queue: str) -> dict[str, str]:
        """The queue's tags."""
        return self._run(_ops.list_queue_tags(queue))

    def list_dead_letter_source_queues(self, queue: str) -> list[str]:
        """URLs of the queues whose redrive policy targets this queue."""
        return self._run(_ops.list_dead_letter_source_queues(queue))

    # -- messages --------------------------------------------------------------------------

    def send_message(
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
        return self._batched(
            queue,
            _ops.send_message(
                queue, message_body, delay_seconds, message_attributes, message_group_id,
                message_deduplication_id, message_system_attributes,
            )
        )

    def send_message_batch(
        self, queue: str, entries: Iterable[Mapping[str, Any]]
    ) -> BatchResult:
        """Send up to 10 boto3-shaped entries (``Id``, ``MessageBody``, ...)."""
        return self._run(_ops.send_message_batch(queue, entries))

    def receive_message(
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
            return self._run(call)
        return self._receives.call(queue, call)

    def delete_message(self, queue: str, receipt_handle: str) -> None:
        """Delete a received message by its latest receipt handle."""
        self._batched(queue, _ops.delete_message(queue, receipt_handle))

    def delete_message_batch(
        self, queue: str, entries: Iterable[Mapping[str, Any]]
    ) -> BatchResult:
        """Delete up to 10 entries ``{"Id", "ReceiptHandle"}``."""
        return self._run(_ops.delete_message_batch(queue, entries))

    def change_message_visibility(
        self, queue: str, receipt_handle: str, visibility_timeout: int
    ) -> None:
        """Set a received message's remaining visibility timeout (0: visible now)."""
        self._batched(queue, _ops.change_message_visibility(queue, receipt_handle,
                                                             visibility_timeout))

    def change_message_visibility_batch(
        self, queue: str, entries: Iterable[Mapping[str, Any]]
    ) -> BatchResult:
        """Change up to 10 entries ``{"Id", "ReceiptHandle", "VisibilityTimeout"}``."""
        return self._run(_ops.change_message_visibility_batch(queue, entries))

    def prefetcher(self, queue: str, buffer: int = 10, *,
                   visibility_timeout: int | None = None, **options: Any) -> Prefetcher:
        """A consumer that receives up to ``buffer`` messages ahead and hands them out one by
        one, never one whose visibility timeout (``visibility_timeout``, else the queue's) is
        about to run out; ``close()`` releases what it still holds. Options:
        ``wait_time_seconds``, ``safety_margin_s``, ``attribute_names``,
        ``message_attribute_names`` (see ``sqsq.client.prefetch``)."""
        return Prefetcher(self, queue, buffer=buffer,
                          visibility_timeout=visibility_timeout, **options)

    # -- dead-letter redrive ---------------------------------------------------------------

    def start_message_move_task(
        self, source_arn: str, destination_arn: str | None = None,
        max_number_of_messages_per_second: int | None = None,
    ) -> str:
        """Move messages out of the dead-letter queue ``source_arn`` (to ``destination_arn``,
        else back to each message's source queue); the task handle."""
        return self._run(_ops.start_message_move_task(
            source_arn, destination_arn, max_number_of_messages_per_second))

    def list_message_move_tasks(
        self, source_arn: str, max_results: int | None = None
    ) -> list[dict[str, Any]]:
        """The newest move tasks of ``source_arn`` (boto3's shape), at most ``max_results``."""
        return self._run(_ops.list_message_move_tasks(source_arn, max_results))

    def cancel_message_move_task(self, task_handle: str) -> int:
        """Cancel a running move task; how many messages it had moved."""
        return self._run(_ops.cancel_message_move_task(task_handle))
