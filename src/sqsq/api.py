"""What the public doors and the shard service share: the ``QueueService`` protocol (every
SQS action as a coroutine), how queue URLs look (``Endpoint``), and small request helpers.

Imported by the gateway (its fronts and forwarding) and by the shard service; it imports
neither, so a node need not load the gateway and a gateway need not load a shard.
"""


from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlparse

from sqsq.core import commands as c

# gRPC metadata: which of a node's shards a call is for (absent: shard 0, as a node of a
# single group is called by the SDK directly).
SHARD_METADATA_KEY = "sqsq-shard"

SYSTEM_ATTRIBUTE_NAMES = frozenset({
    "All",
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "MessageGroupId",
    "MessageDeduplicationId",
    "SequenceNumber",
    "DeadLetterQueueSourceArn",
    "AWSTraceHeader",
    "SqsManagedSseEnabled",
})


@functools.lru_cache(maxsize=1024)  # every call parses its URL; clients reuse a few
def queue_name_of(queue_url: str) -> str:
    """A queue URL (http://host:port/account/name) or a bare name -> the name."""
    if "/" in queue_url:
        path = urlparse(queue_url).path if "://" in queue_url else queue_url
        return path.rstrip("/").rsplit("/", 1)[-1]
    return queue_url


def wants_attribute(selected: Iterable[str], name: str) -> bool:
    """Message attribute selection as SQS does it: a name, "All", "*", ".*", or "prefix.*"."""
    for s in selected:
        if s in ("All", "*", ".*") or s == name or (s.endswith(".*") and name.startswith(s[:-1])):
            return True
    return False


@dataclass(frozen=True)
class Endpoint:
    """How queue URLs look from outside: http://host:port/account/name."""

    base_url: str = "http://127.0.0.1:9324"
    account: str = "000000000000"

    def queue_url(self, name: str) -> str:
        return f"{self.base_url}/{self.account}/{name}"


class QueueService(Protocol):
    """What the gRPC service and the HTTP front call: every SQS action as a coroutine.

    ``QueueApi`` serves it from a shard engine in this process (``sqsq server``);
    ``ForwardingApi`` from a node over gRPC (``sqsq gateway``). Failures raise ``QueueError``.
    """

    endpoint: Endpoint

    async def create_queue(self, name: str, attributes: Mapping[str, str] | None = None,
                           tags: Mapping[str, str] | None = None) -> str: ...
    async def get_queue_url(self, name: str) -> str: ...
    async def list_queues(self, prefix: str = "", max_results: int | None = None,
                          next_token: str = "") -> tuple[list[str], str]: ...
    async def delete_queue(self, queue_url: str) -> None: ...
    async def purge_queue(self, queue_url: str) -> None: ...
    async def get_queue_attributes(self, queue_url: str,
                                   names: list[str]) -> dict[str, str]: ...
    async def set_queue_attributes(self, queue_url: str,
                                   attributes: Mapping[str, str]) -> None: ...
    async def tag_queue(self, queue_url: str, tags: Mapping[str, str]) -> None: ...
    async def untag_queue(self, queue_url: str, keys: Iterable[str]) -> None: ...
    async def list_queue_tags(self, queue_url: str) -> dict[str, str]: ...
    async def list_dead_letter_source_queues(self, queue_url: str) -> list[str]: ...
    async def start_message_move_task(
        self, source_arn: str, destination_arn: str | None = None,
        max_number_of_messages_per_second: int | None = None, task_stamp: str = "") -> str: ...
    async def cancel_message_move_task(self, task_handle: str) -> int: ...
    async def list_message_move_tasks(self, source_arn: str,
                                      max_results: int | None = None) -> list[dict]: ...
    async def send_message_batch(self, queue_url: str, entries: list[c.SendEntry],
                                 request_id: str = "") -> c.BatchResult: ...
    async def receive_message(
        self, queue_url: str, max_number_of_messages: int | None = None,
        visibility_timeout: int | None = None, wait_time_seconds: int | None = None,
        attribute_names: Iterable[str] = (), message_attribute_names: Iterable[str] = (),
        receive_request_attempt_id: str = "") -> list[c.ReceivedMessage]: ...
    async def delete_message_batch(self, queue_url: str,
                                   entries: list[tuple[str, str]]) -> c.BatchResult: ...
    async def change_message_visibility_batch(
        self, queue_url: str, entries: list[tuple[str, str, int]]) -> c.BatchResult: ...


