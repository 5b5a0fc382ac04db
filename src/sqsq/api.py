"""What the public doors and the shard service share: the ``QueueService`` protocol (every
SQS action as a coroutine), how queue URLs look and which queue one names (``Endpoint``),
and small request helpers.

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
from sqsq.core import regions
from sqsq.wire import REGION_METADATA_KEY, SHARD_METADATA_KEY  # noqa: F401 - re-exported

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


def queue_name_of(queue_url: str) -> str:
    """A queue URL (http://host:port/[region/]account/name) or a bare name -> the name."""
    return _url_parts(queue_url, "")[1]


@functools.lru_cache(maxsize=1024)  # every call parses its URL; clients reuse a few
def _url_parts(queue: str, base_path: str) -> tuple[str | None, str]:
    """(the region it names or None, name) of a queue URL, its path, or a bare name."""
    if "/" not in queue:
        return None, queue
    path = urlparse(queue).path if "://" in queue else queue
    if base_path and path.startswith(base_path + "/"):
        path = path[len(base_path):]  # a public URL's own path is not a region
    parts = [p for p in path.split("/") if p]
    if not parts:
        return None, ""
    named = parts[-3] if len(parts) >= 3 and regions.valid_region(parts[-3]) else None
    return named, parts[-1]


def wants_attribute(selected: Iterable[str], name: str) -> bool:
    """Message attribute selection as SQS does it: a name, "All", "*", ".*", or "prefix.*"."""
    for s in selected:
        if s in ("All", "*", ".*") or s == name or (s.endswith(".*") and name.startswith(s[:-2])):
            return True
    return False


@dataclass(frozen=True)
class Endpoint:
    """How queue URLs look from outside, and which queue a URL or name means.

    A queue URL is http://host:port/account/name in the configured region (as before sqsq
    had regions) and http://host:port/region/account/name in any other. Inside, a queue is
    named by its key (``sqsq.core.regions``).
    """

    base_url: str = "http://127.0.0.1:9324"
    account: str = "000000000000"
    region: str = "us-east-1"  # the configured region: its URLs and keys name none

    def queue_url(self, key: str) -> str:
        region, name = regions.split_key(key, self.region)
        where = "" if region == self.region else f"/{region}"
        return f"{self.base_url}{where}/{self.account}/{name}"

    def queue_key(self, queue: str, region: str | None = None) -> str:
        """The key of the queue a URL (or its path, or a bare name) addresses for a caller in
        ``region`` (None: the configured region). A URL that names a region wins."""
        named, name = _url_parts(queue, self._base_path)
        return regions.queue_key(named or region or self.region, name, self.region)

    def named_key(self, name: str, region: str | None = None) -> str:
        """The key of the queue called ``name`` (never a URL: CreateQueue's QueueName) in
        ``region`` (None: the configured region); also a ListQueues prefix's."""
        return regions.queue_key(region or self.region, name, self.region)

    def key_of_arn(self, arn: str) -> str | None:
        return regions.key_of_arn(arn, self.region, self.account)

    @functools.cached_property
    def _base_path(self) -> str:
        return urlparse(self.base_url).path.rstrip("/")


class QueueService(Protocol):
    """What the gRPC service and the HTTP front call: every SQS action as a coroutine.

    ``ShardService`` serves it from a shard engine in this process (``sqsq server``, a
    node); ``ForwardingApi`` from a node over gRPC and ``ClusterApi`` over a cluster
    (``sqsq gateway``). Failures raise ``QueueError``.

    Queues are named by their keys (``queue_url`` and ``name`` parameters; ``prefix`` is a
    prefix's key): the doors turn a URL or name and the caller's region into one with
    ``endpoint``. URLs go out.
    """

    endpoint: Endpoint

    async def create_queue(self, name: str, attributes: Mapping[str, str] | None = None,
                           tags: Mapping[str, str] | None = None) -> str: ...
    async def get_queue_url(self, name: str) -> str: ...
    async def list_queues(self, prefix: str = "", max_results: int | None = None,
                          next_token: str = "") -> tuple[list[str], str]: ...
    async def delete_queue(self, queue: str) -> None: ...
    async def purge_queue(self, queue: str) -> None: ...
    async def get_queue_attributes(self, queue: str,
                                   names: list[str]) -> dict[str, str]: ...
    async def set_queue_attributes(self, queue: str,
                                   attributes: Mapping[str, str]) -> None: ...
    async def tag_queue(self, queue: str, tags: Mapping[str, str]) -> None: ...
    async def untag_queue(self, queue: str, keys: Iterable[str]) -> None: ...
    async def list_queue_tags(self, queue: str) -> dict[str, str]: ...
    async def list_dead_letter_source_queues(self, queue: str) -> list[str]: ...
    async def start_message_move_task(
        self, source_arn: str, destination_arn: str | None = None,
        max_number_of_messages_per_second: int | None = None, task_stamp: str = "") -> str: ...
    async def cancel_message_move_task(self, task_handle: str) -> int: ...
    async def list_message_move_tasks(self, source_arn: str,
                                      max_results: int | None = None) -> list[dict]: ...
    async def send_message_batch(self, queue: str, entries: list[c.SendEntry],
                                 request_id: str = "") -> c.BatchResult: ...
    async def receive_message(
        self, queue: str, max_number_of_messages: int | None = None,
        visibility_timeout: int | None = None, wait_time_seconds: int | None = None,
        attribute_names: Iterable[str] = (), message_attribute_names: Iterable[str] = (),
        receive_request_attempt_id: str = "") -> list[c.ReceivedMessage]: ...
    async def delete_message_batch(self, queue: str,
                                   entries: list[tuple[str, str]]) -> c.BatchResult: ...
    async def change_message_visibility_batch(
        self, queue: str, entries: list[tuple[str, str, int]]) -> c.BatchResult: ...


