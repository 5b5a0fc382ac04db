"""``QueueService`` over a cluster: what ``sqsq gateway --etcd`` serves its fronts from.

The gateway keeps no queue state. The partition map (etcd, cached through a watch) says which
shards hold a queue: one per partition, each partition a queue of the same name on its own
shard, so every shard answers with the queue's own URL and ARN. What the gateway adds:

- **Sends**: a standard queue's calls go to its home partition, every client's and
  gateway's alike, so that they share that shard's Raft entries; while the leader there is
  busy (its node says so in the map), to a few partitions from there on, a burst at a time
  (``MapSnapshot.send_partitions``, ``sqsq.wire.SendSpread``). A FIFO queue's entries go to
  the partition their MessageGroupId hashes to, so a group's order holds.
- **Receives** try the partitions in turn, starting where the last receive found messages
  (``sqsq.wire.ReceiveSpread``); a long poll
  that finds nothing waits on all of them and answers with the first that has messages.
  (The other polls are cancelled; a message one of them had just received stays in flight
  until its visibility timeout ends: at-least-once, never lost.)
- **Deletes and visibility changes** go to the shard the receipt handle names.
- **Queue actions** go to every partition (partition 0 first: it validates for all).
  Counts are summed; ListQueues and ListDeadLetterSourceQueues see the whole cluster.
- **Dead-letter queues**: a shard moves a message to its dead-letter queue locally, so a
  dead-letter queue has a partition on every shard its source queues have one on. A queue
  created with a redrive policy is placed on its dead-letter queue's shards; a redrive
  policy set later gives the dead-letter queue partitions on the source's shards. A move
  task runs on every partition (one handle: the gateway draws the task's stamp).
- Queue creation: the first gateway to write the queue's record in etcd (a transaction that
  succeeds only if the name is free) decides its partitions; then each shard creates it
  (the records: ``sqsq.gateway.queuerecords``).
- Regions: a queue is named by its key (``sqsq.core.regions``), in etcd too; a shard is
  told a queue's name and region (``forwarding.about``).
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqsq.api import Endpoint
from sqsq.client import _call, _ops
from sqsq.control.etcd import Etcd
from sqsq.control.keys import QueueRecord
from sqsq.control.partition_map import PartitionMap
from sqsq.core import commands as c
from sqsq.core import queries, regions
from sqsq.core.names import validate_queue_name
from sqsq.core.queues import queue_does_not_exist
from sqsq.core.redrive import parse_task_handle
from sqsq.errors import QueueError, Rejection, ServiceUnavailable, from_rejection
from sqsq.gateway import forwarding as fw
from sqsq.gateway.queuerecords import QueueRecords
from sqsq.gateway.routing import ShardCaller, pass_through
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import (
    first_found,
    group_partition,
    in_background,
    send_partition,
    shard_of_receipt_handle,
)

# Computed per partition: the queue's figure is their sum.
SUMMED_ATTRIBUTES = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                     "ApproximateNumberOfMessagesDelayed")


def _raise(rejection: Rejection) -> None:
    raise from_rejection(rejection)


class ClusterApi:
    def __init__(self, etcd: Etcd, partition_map: PartitionMap, endpoint: Endpoint, *,
                 partitions: int = 1, credentials: tuple[str, str] | None = None) -> None:
        self.map = partition_map
        self.endpoint = endpoint
        self.caller = ShardCaller(partition_map, credentials=credentials)
        self.records = QueueRecords(etcd, partition_map, endpoint, self.caller,
                                    partitions=partitions)
        self._about = self.records.about  # a call told which queue it is about
        self._releases: set[asyncio.Future] = set()  # ``in_background``

    async def close(self) -> None:
        await self.caller.close()

    # -- where a queue lives (its record: ``self.records``) ---------------------------------

    async def _each(self, record: QueueRecord, call: Callable[[], _call.Call]) -> list[Any]:
        """``call`` on every partition, the first alone (it validates for all)."""
        first = await self.caller.call(record.partitions[0], call())
        rest = await asyncio.gather(*(self.caller.call(s, call())
                                      for s in record.partitions[1:]))
        return [first, *rest]

    async def describe_queue_route(self, name: str) -> pb.QueueRoute:
        """Where the queue's partitions live, for the SDK's direct routing: each shard's
        replicas as this gateway would try them (``ShardCaller.targets``), told the queue as
        a node is told it (``forwarding.about``)."""
        record = await self.records.lookup(name)
        if record is None:
            _raise(queue_does_not_exist())
        assert record is not None
        region, short = regions.split_key(name, self.endpoint.region)
        snapshot = self.map.snapshot
        home, width = snapshot.send_partitions(name)
        route = pb.QueueRoute(queue_name=short, region=region, fifo=short.endswith(".fifo"),
                              version=snapshot.revision, send_home=home, send_width=width)
        for shard in record.partitions:
            leader, hint = snapshot.leader_hint(shard), snapshot.leaders.get(shard)
            route.partitions.add(shard=shard, nodes=self.caller.targets(shard),
                                 leader=leader.grpc_address if leader else "",
                                 leader_term=hint.term if leader and hint else 0)
        return route

    async def pass_through(self, method: str, request: Any, key: str) -> Any | None:
        """A message call for one shard, answered there as it came (``routing.pass_through``);
        None when it is not for one shard."""
        return await pass_through(self.caller, self.endpoint.region, method, request, key)

    # -- queues ----------------------------------------------------------------------------

    async def create_queue(self, name: str, attributes: Mapping[str, str] | None = None,
                           tags: Mapping[str, str] | None = None) -> str:
        attributes = dict(attributes or {})
        invalid = validate_queue_name(regions.name_of(name))
        if invalid is not None:  # before the name becomes an etcd key
            _raise(invalid)
        record = await self.records.lookup(name)
        created = False
        if record is None:
            record, created = await self.records.place(
                name, await self.records.dead_letter_queue(name, attributes))
        try:
            await self.records.cover_dead_letter_queue(record, attributes)
            await self._each(record, lambda: self._about(name, _ops.create_queue, attributes,
                                                         tags))
        except QueueError:
            if created:  # the shards refused it: free the name again
                await self.records.forget(record)
            raise
        return self.endpoint.queue_url(name)

    async def get_queue_url(self, name: str) -> str:
        record = await self.records.queue(name)
        await self.caller.call(record.partitions[0], self._about(name, _ops.get_queue_url))
        return self.endpoint.queue_url(name)

    async def list_queues(self, prefix: str = "", max_results: int | None = None,
                          next_token: str = "") -> tuple[list[str], str]:
        names = sorted(regions.keys_with_prefix(self.map.snapshot.queues, prefix,
                                                self.endpoint.region))
        page = queries.names_page(names, max_results, next_token)
        if isinstance(page, Rejection):
            _raise(page)
        names, token = page  # type: ignore[misc]
        return [self.endpoint.queue_url(n) for n in names], token

    async def delete_queue(self, queue: str) -> None:
        record = await self.records.queue(queue)
        await self._each(record, lambda: self._about(queue, _ops.delete_queue))
        await self.records.forget(record)

    async def purge_queue(self, queue: str) -> None:
        await self._each(await self.records.queue(queue),
                         lambda: self._about(queue, _ops.purge_queue))

    async def get_queue_attributes(self, queue: str, names: list[str]) -> dict[str, str]:
        record = await self.records.queue(queue)
        first, *rest = await self._each(
            record, lambda: self._about(queue, _ops.get_queue_attributes, names))
        for key in SUMMED_ATTRIBUTES:
            if key in first:
                first[key] = str(sum(int(a.get(key, 0)) for a in (first, *rest)))
        return first

    async def set_queue_attributes(self, queue: str, attributes: Mapping[str, str]) -> None:
        record = await self.records.queue(queue)
        await self.records.cover_dead_letter_queue(record, attributes)
        await self._each(record,
                         lambda: self._about(queue, _ops.set_queue_attributes, attributes))

    async def tag_queue(self, queue: str, tags: Mapping[str, str]) -> None:
        await self._each(await self.records.queue(queue),
                         lambda: self._about(queue, _ops.tag_queue, tags))

    async def untag_queue(self, queue: str, keys_: Iterable[str]) -> None:
        tag_keys = list(keys_)
        await self._each(await self.records.queue(queue),
                         lambda: self._about(queue, _ops.untag_queue, tag_keys))

    async def list_queue_tags(self, queue: str) -> dict[str, str]:
        record = await self.records.queue(queue)
        return await self.caller.call(record.partitions[0],
                                      self._about(queue, _ops.list_queue_tags))

    async def list_dead_letter_source_queues(self, queue: str) -> list[str]:
        found = await self._each(await self.records.queue(queue), lambda: self._about(
            queue, _ops.list_dead_letter_source_queues))
        # A dead-letter queue's sources are in its region (SQS requires it).
        home = self.endpoint.region
        region = regions.region_of(queue, home)
        return [self.endpoint.queue_url(k) for k in
                sorted({k for urls in found for k in fw.keys_in(urls, region, home)})]

    # -- dead-letter redrive: a move task runs on every partition of the dead-letter queue
    #    that has messages from a source (one handle for all: the gateway draws its stamp)

    async def start_message_move_task(
        self, source_arn: str, destination_arn: str | None = None,
        max_number_of_messages_per_second: int | None = None, task_stamp: str = "",
    ) -> str:
        if destination_arn:  # the messages move shard by shard: it needs a partition on each
            source = await self.records.record_of_arn(source_arn)
            destination = await self.records.record_of_arn(destination_arn)
            if source is not None and destination is not None:
                await self.records.extend(destination, source)
        stamp = secrets.token_urlsafe(24)
        handles = await self._on_partitions(source_arn, lambda: _ops.start_message_move_task(
            source_arn, destination_arn, max_number_of_messages_per_second, stamp))
        return handles[0]

    async def cancel_message_move_task(self, task_handle: str) -> int:
        parsed = parse_task_handle(task_handle)
        moved = await self._on_partitions(parsed[1] if parsed else "",
                                          lambda: _ops.cancel_message_move_task(task_handle))
        return sum(moved)

    async def list_message_move_tasks(self, source_arn: str,
                                      max_results: int | None = None) -> list[dict]:
        lists = await self._on_partitions(
            source_arn, lambda: _ops.list_message_move_tasks(source_arn, max_results))
        # A running task has its handle, the same on every partition; a finished one shows
        # none, and is matched by its place among the partition's tasks (newest first).
        merged: dict[Any, dict] = {}
        for tasks in lists:
            for i, task in enumerate(tasks):
                key = task.get("TaskHandle") or i
                seen = merged.get(key)
                if seen is None:
                    merged[key] = dict(task)
                    continue
                for key in ("ApproximateNumberOfMessagesMoved",
                            "ApproximateNumberOfMessagesToMove"):
                    if key in task:
                        seen[key] = seen.get(key, 0) + task[key]
                if task.get("Status") == "RUNNING":
                    seen["Status"] = "RUNNING"
        out = list(merged.values())  # partition 0's order: newest first
        return out[:max_results] if max_results else out

    async def _on_partitions(self, arn: str, call: Callable[[], _call.Call]) -> list[Any]:
        """``call`` on every partition of the queue ``arn`` names; the answers of those that
        accepted it (a partition without a task, or without a source queue redriving to it,
        refuses). If none accepted, the first partition's refusal, as SQS would answer."""
        shards = self._shards_of_arn(arn)
        answers = await asyncio.gather(*(self.caller.call(s, call()) for s in shards),
                                       return_exceptions=True)
        accepted = [a for a in answers if not isinstance(a, BaseException)]
        if accepted:
            return accepted
        # A partition no source redrives to, or without the task, says only that: another
        # partition's refusal (a task already running there, say) is the answer.
        telling = [a for a in answers if not (isinstance(a, QueueError) and a.message in (
            "Source queue must be configured as a Dead Letter Queue.", "Task does not exist."))]
        raise (telling or answers)[0]

    def _shards_of_arn(self, arn: str) -> tuple[int, ...]:
        """The shards of the queue an ARN names; for an ARN naming no known queue, any one
        shard: it answers with the SQS error for that ARN."""
        key = self.endpoint.key_of_arn(arn)
        record = self.map.snapshot.queue(key) if key else None
        if record is not None:
            return record.partitions
        shards = sorted(self.map.snapshot.shards)
        if not shards:
            raise ServiceUnavailable("the cluster has no shards yet")
        return (shards[0],)

    # -- messages --------------------------------------------------------------------------

    async def send_message_batch(self, queue: str, entries: list[c.SendEntry],
                                 request_id: str = "") -> c.BatchResult:
        record = await self.records.queue(queue)
        request_id = request_id or str(uuid.uuid4())
        n = len(record.partitions)
        if n == 1 or not queue.endswith(".fifo"):
            home, width = self.map.snapshot.send_partitions(queue)
            shard = record.partitions[send_partition(self.caller.sends.turn(), home, width, n)]
            return await self.caller.call(shard, self._about(queue, fw.send_batch_call, entries,
                                                             request_id))
        by_partition: dict[int, list[c.SendEntry]] = {}
        for entry in entries:
            # An entry without a group goes to partition 0, whose shard refuses it properly.
            p = group_partition(entry.message_group_id, n) if entry.message_group_id else 0
            by_partition.setdefault(p, []).append(entry)
        results = await asyncio.gather(*(
            self.caller.call(record.partitions[p], self._about(
                queue, fw.send_batch_call, part, f"{request_id}/{p}"))
            for p, part in sorted(by_partition.items())))
        return _merged(results)

    async def receive_message(
        self, queue: str, max_number_of_messages: int | None = None,
        visibility_timeout: int | None = None, wait_time_seconds: int | None = None,
        attribute_names: Iterable[str] = (), message_attribute_names: Iterable[str] = (),
        receive_request_attempt_id: str = "",
    ) -> list[c.ReceivedMessage]:
        record = await self.records.queue(queue)

        def receive(wait: int | None) -> _call.Call:
            return self._about(queue, fw.receive_call, max_number_of_messages,
                               visibility_timeout, wait, attribute_names,
                               message_attribute_names, receive_request_attempt_id)

        shards = record.partitions
        if len(shards) == 1:
            return await self.caller.call(shards[0], receive(wait_time_seconds))
        spread = self.caller.receives
        first = spread.first(queue)
        start = first % len(shards)
        order = shards[start:] + shards[:start]
        began = time.monotonic()
        for k, shard in enumerate(order):  # whatever is there now, partition by partition
            messages = await self.caller.call(shard, receive(0))
            if messages:
                spread.found(queue, first + k)
                return messages
        if wait_time_seconds:  # what the look took (a leader being elected) is not waited again
            wait_time_seconds = _call.seconds_left(wait_time_seconds, time.monotonic() - began)
        if wait_time_seconds == 0:
            return []
        k, messages = await first_found([self.caller.call(s, receive(wait_time_seconds))
                                         for s in order], bool,
                                        lambda k, taken: self._release(queue, order[k], taken))
        if not messages:
            return []
        spread.found(queue, first + k)  # the next receives look there first
        return messages

    def _release(self, queue: str, shard: int, messages: list[c.ReceivedMessage]) -> None:
        """Messages a long poll took that its caller will not get: visible again now."""
        in_background(self._releases, self.caller.call(shard, fw.batch_call(self._about(
            queue, _ops.release_messages, messages))))

    async def delete_message_batch(self, queue: str,
                                   entries: list[tuple[str, str]]) -> c.BatchResult:
        record = await self.records.queue(queue)
        return await self._by_handle(record, entries, lambda part: self._about(
            queue, _ops.delete_message_batch, [{"Id": i, "ReceiptHandle": h} for i, h in part]))

    async def change_message_visibility_batch(
        self, queue: str, entries: list[tuple[str, str, int]]
    ) -> c.BatchResult:
        record = await self.records.queue(queue)
        return await self._by_handle(record, entries, lambda part: self._about(
            queue, _ops.change_message_visibility_batch, [
                {"Id": i, "ReceiptHandle": h, "VisibilityTimeout": t} for i, h, t in part]))

    async def _by_handle(self, record: QueueRecord, entries: list,
                         call: Callable[[list], _call.Call]) -> c.BatchResult:
        """Each entry to the shard its receipt handle names (a handle naming no partition of
        this queue goes to the first, which refuses it as SQS would)."""
        by_shard: dict[int, list] = {record.partitions[0]: []} if not entries else {}
        for entry in entries:  # (an empty batch goes to the first, which refuses it)
            shard = shard_of_receipt_handle(entry[1])
            if shard not in record.partitions:
                shard = record.partitions[0]
            by_shard.setdefault(shard, []).append(entry)
        results = await asyncio.gather(*(
            self.caller.call(shard, fw.batch_call(call(part)))  # noqa: B023 - awaited here
            for shard, part in by_shard.items()))
        return _merged(results)


def _merged(results: Iterable[c.BatchResult]) -> c.BatchResult:
    ok: list = []
    failed: list = []
    for result in results:
        ok.extend(result.successful)
        failed.extend(result.failed)
    return c.BatchResult(tuple(ok), tuple(failed))

