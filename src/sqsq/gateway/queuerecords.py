"""Where a queue lives in a cluster: its record in etcd (its id and the shards of its
partitions), read through the gateway's cached partition map, written when a gateway places a
new queue, and grown when a dead-letter queue must have a partition on each of a source
queue's shards (a shard moves a message to its dead-letter queue locally).
``sqsq.gateway.cluster.ClusterApi`` serves the calls over it."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from sqsq.api import Endpoint
from sqsq.client import _call, _ops
from sqsq.control import keys
from sqsq.control.etcd import CasConflict, Etcd, EtcdError
from sqsq.control.keys import QueueRecord
from sqsq.control.partition_map import PartitionMap
from sqsq.control.placement import PlacementError, assign_partitions
from sqsq.core import queries, regions
from sqsq.core.queues import queue_does_not_exist
from sqsq.errors import ServiceUnavailable, from_rejection
from sqsq.gateway import forwarding as fw
from sqsq.gateway.routing import ShardCaller

log = logging.getLogger("sqsq.gateway")

# How long a delete waits for the gateway's map to let the queue go (``forget``).
FORGET_WAIT_S = 5.0
# What a dead-letter queue's new partition copies from its first one.
NOT_COPIED = frozenset(queries.COMPUTED_ATTRIBUTE_NAMES) | {"FifoQueue"}


class QueueRecords:
    """The queues' records, as one gateway reads and writes them. ``partitions``: how many a
    new queue gets (at most one per shard)."""

    def __init__(self, etcd: Etcd, partition_map: PartitionMap, endpoint: Endpoint,
                 caller: ShardCaller, *, partitions: int = 1) -> None:
        self.etcd = etcd
        self.map = partition_map
        self.endpoint = endpoint
        self.caller = caller
        self.partitions = partitions

    def about(self, key: str, build: Callable[..., _call.Call], *args: Any) -> _call.Call:
        return fw.about(key, self.endpoint.region, build, *args)

    async def queue(self, name: str) -> QueueRecord:
        record = await self.lookup(name)
        if record is None:
            # Unknown: a shard answers, judging the request's shape first as SQS does, then
            # saying the queue does not exist.
            shards = sorted(self.map.snapshot.shards)
            if not shards:
                raise from_rejection(queue_does_not_exist())
            return QueueRecord(name, "", (shards[0],))
        return record

    async def lookup(self, name: str) -> QueueRecord | None:
        """The queue's record: from the cached map, else from etcd (created through another
        gateway just now?)."""
        return self.map.snapshot.queue(name) or await self._read(name)

    async def _read(self, name: str) -> QueueRecord | None:
        try:
            kv = await self.etcd.get(keys.queue_key(name))
        except (EtcdError, keys.RecordError):
            return None  # etcd away: the cached map is all there is
        return keys.decode_queue(kv.value) if kv is not None else None

    async def place(self, name: str,
                     dead_letter_queue: QueueRecord | None) -> tuple[QueueRecord, bool]:
        """Write the new queue's record: its partitions on the least loaded shards, or, for a
        queue that redrives to a dead-letter queue, on that queue's shards (redrive stays
        within a shard)."""
        snapshot = self.map.snapshot
        shard_ids = sorted(snapshot.shards)
        if not shard_ids:
            raise ServiceUnavailable("the cluster has no shards yet")
        try:
            partitions = assign_partitions(shard_ids, snapshot.queues.values(),
                                           min(self.partitions, len(shard_ids)))
        except PlacementError as exc:
            raise ServiceUnavailable(str(exc)) from None
        if dead_letter_queue is not None:
            partitions = dead_letter_queue.partitions[:len(partitions)]
        record = QueueRecord(name, str(uuid.uuid4()), partitions)
        try:
            await self.etcd.compare_and_put(keys.queue_key(name), keys.encode(record), 0)
        except CasConflict as conflict:  # another gateway placed it first: theirs stands
            assert conflict.current is not None
            return keys.decode_queue(conflict.current.value), False
        except EtcdError as exc:
            raise ServiceUnavailable(f"cannot create a queue while etcd is away: {exc}") from None
        await self.map.wait_for(lambda s: s.queue(name) is not None)
        return record, True

    async def forget(self, record: QueueRecord) -> None:
        """Delete the queue's record, if it is still this one, and return once this gateway's
        map has let it go: a list right after a delete, or after a create the shards refused,
        must not name the queue (the map learns of the delete from its etcd watch a moment
        later; on a lone call's fast path the next call came first)."""
        kv = await self.etcd.get(keys.queue_key(record.name))
        if kv is not None and keys.decode_queue(kv.value) == record:
            try:
                await self.etcd.compare_and_delete(kv.key, kv.mod_revision)
            except CasConflict:
                return  # replaced meanwhile: the new record stands
        try:
            await self.map.wait_for(lambda s: s.queue(record.name) != record, FORGET_WAIT_S)
        except TimeoutError:  # the watch is behind: the delete is done all the same
            log.warning("the partition map still names queue %s after its delete",
                        record.name)

    async def cover_dead_letter_queue(self, source: QueueRecord,
                                       attributes: Mapping[str, str]) -> None:
        """Give the dead-letter queue a redrive policy names a partition on every shard of
        ``source`` (created like its first partition). Unknown targets are left to the
        shard to refuse."""
        dlq = await self.dead_letter_queue(source.name, attributes)
        if dlq is not None:
            await self.extend(dlq, source)

    async def dead_letter_queue(self, key: str,
                                 attributes: Mapping[str, str]) -> QueueRecord | None:
        """The queue a RedrivePolicy among ``attributes`` names, if there is one in the
        region of queue ``key`` (another region's is for the shard to refuse)."""
        try:
            target = json.loads(attributes.get("RedrivePolicy") or "{}")["deadLetterTargetArn"]
        except (ValueError, KeyError, TypeError):
            return None
        dlq = await self.record_of_arn(str(target))
        home = self.endpoint.region
        same = dlq is not None and regions.region_of(dlq.name, home) == regions.region_of(
            key, home)
        return dlq if same else None

    async def record_of_arn(self, arn: str) -> QueueRecord | None:
        key = self.endpoint.key_of_arn(arn)
        return None if key is None else await self.lookup(key)

    async def extend(self, dlq: QueueRecord, source: QueueRecord) -> None:
        """Give ``dlq`` a partition on every shard of ``source`` (created like its first
        partition), so a shard can move messages from one to the other itself."""
        if dlq.name == source.name:
            return
        missing = [s for s in source.partitions if s not in dlq.partitions]
        if not missing:
            return
        shown = await self.caller.call(dlq.partitions[0], self.about(
            dlq.name, _ops.get_queue_attributes, ["All"]))
        copied = {k: v for k, v in shown.items() if k not in NOT_COPIED}
        if dlq.name.endswith(".fifo"):
            copied["FifoQueue"] = "true"
        tags = await self.caller.call(dlq.partitions[0],
                                      self.about(dlq.name, _ops.list_queue_tags))
        for shard in missing:
            await self.caller.call(shard, self.about(dlq.name, _ops.create_queue, copied,
                                                      tags))

        def grow(current: Any) -> bytes | None:
            if current is None:
                return None
            now = keys.decode_queue(current.value)
            extra = tuple(s for s in missing if s not in now.partitions)
            return keys.encode(QueueRecord(now.name, now.queue_id, now.partitions + extra)) \
                if extra else None

        revision = await self.etcd.update(keys.queue_key(dlq.name), grow)
        await self.map.wait_revision(revision)
