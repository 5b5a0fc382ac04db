"""Client drivers: one small async interface over each system's usual Python client.

A driver is made in each worker process from a picklable spec (``{"kind": ..., ...}``).
``send`` raises when any message was not accepted; ``receive`` returns opaque messages that
``delete`` takes back. Queue references (``ref``) are what ``create_queue`` returned.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

VISIBILITY_TIMEOUT_S = 30


class Driver:
    """The interface every system implements."""

    supports_fifo = True

    def __init__(self, spec: dict[str, Any], inflight: int = 16) -> None:
        self.spec = spec
        self.inflight = inflight

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def create_queue(self, name: str, fifo: bool) -> str:
        raise NotImplementedError

    async def delete_queue(self, ref: str) -> None: ...

    async def depth(self, ref: str) -> int | None:
        return None

    async def send(self, ref: str, bodies: list[str], groups: list[str | None]) -> None:
        raise NotImplementedError

    async def receive(self, ref: str, n: int, wait_s: int) -> list[Any]:
        raise NotImplementedError

    async def delete(self, ref: str, msgs: list[Any]) -> None:
        raise NotImplementedError


def _fifo_fields(group: str | None) -> dict[str, str]:
    if group is None:
        return {}
    return {"MessageGroupId": group, "MessageDeduplicationId": uuid.uuid4().hex}


class SqsqGrpcDriver(Driver):
    """sqsq's own SDK (``AsyncClient``, gRPC), with its automatic batching of single-message
    calls unless the spec says ``"batching": False`` (and on the server's frame connection
    unless ``"frames": False``; given a cluster's gateway, calling the shard leaders directly
    unless ``"direct": False``); with ``"prefetch": True``, receives of
    one message go through the SDK's opt-in prefetchers (``AsyncClient.prefetcher``), one per
    consumer loop at most, each receiving up to 10 ahead."""

    async def open(self) -> None:
        from sqsq.client import AsyncClient, _frames

        # Read when the server offers its frame connection, so set either way.
        os.environ[_frames.ENV_FRAMES] = "1" if self.spec.get("frames", True) else "0"
        self.client = AsyncClient(self.spec["endpoint"], timeout=60.0,
                                  batching=self.spec.get("batching", True),
                                  direct=self.spec.get("direct", True))
        self.inboxes: dict[str, list[Any]] = {}  # idle prefetchers per queue (all, once idle)
        await self.client.list_queues(max_results=1)  # connect before the clock starts

    async def close(self) -> None:
        for idle in self.inboxes.values():  # every loop has ended: each prefetcher is idle
            for inbox in idle:
                await inbox.close()  # releases what it still holds
        await self.client.close()

    async def create_queue(self, name: str, fifo: bool) -> str:
        attrs = {"VisibilityTimeout": str(VISIBILITY_TIMEOUT_S)}
        if fifo:
            attrs["FifoQueue"] = "true"
            name += ".fifo"
        return await self.client.create_queue(name, attributes=attrs)

    async def delete_queue(self, ref: str) -> None:
        await self.client.delete_queue(ref)

    async def depth(self, ref: str) -> int | None:
        attrs = await self.client.get_queue_attributes(ref, ["ApproximateNumberOfMessages"])
        return int(attrs.get("ApproximateNumberOfMessages", 0))

    async def send(self, ref: str, bodies: list[str], groups: list[str | None]) -> None:
        if len(bodies) == 1:
            f = _fifo_fields(groups[0])
            await self.client.send_message(
                ref, bodies[0], message_group_id=f.get("MessageGroupId"),
                message_deduplication_id=f.get("MessageDeduplicationId"))
            return
        entries = [{"Id": str(i), "MessageBody": b, **_fifo_fields(g)}
                   for i, (b, g) in enumerate(zip(bodies, groups, strict=True))]
        result = await self.client.send_message_batch(ref, entries)
        if result.failed:
            raise RuntimeError(f"{len(result.failed)} entries failed: {result.failed[0]}")

    async def receive(self, ref: str, n: int, wait_s: int) -> list[Any]:
        if n == 1 and self.spec.get("prefetch"):
            return await self._prefetched(ref, wait_s)
        msgs = await self.client.receive_message(
            ref, max_number_of_messages=n, wait_time_seconds=wait_s)
        return [m.receipt_handle for m in msgs]

    async def _prefetched(self, ref: str, wait_s: int) -> list[Any]:
        idle = self.inboxes.setdefault(ref, [])
        if idle:  # the one holding the most, so held messages do not wait behind fetches
            inbox = max(idle, key=lambda i: i.buffered)
            idle.remove(inbox)
        else:
            inbox = self.client.prefetcher(ref, 10, visibility_timeout=VISIBILITY_TIMEOUT_S)
        try:
            msgs = await inbox.receive(1, wait_s)
        finally:
            idle.append(inbox)
        return [m.receipt_handle for m in msgs]

    async def delete(self, ref: str, msgs: list[Any]) -> None:
        if len(msgs) == 1:
            await self.client.delete_message(ref, msgs[0])
            return
        result = await self.client.delete_message_batch(
            ref, [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(msgs)])
        if result.failed:
            raise RuntimeError(f"{len(result.failed)} deletes failed: {result.failed[0]}")


class Boto3Driver(Driver):
    """boto3's SQS client against an SQS-compatible endpoint (moto_server, sqsq's HTTP API).

    boto3 is blocking, so each process runs it on ``inflight`` threads.
    """

    async def open(self) -> None:
        import boto3
        from botocore.config import Config

        self.pool = ThreadPoolExecutor(self.inflight, thread_name_prefix="boto3")
        self.sqs = boto3.client(
            "sqs", endpoint_url=self.spec["url"], region_name="us-east-1",
            aws_access_key_id=self.spec.get("key_id", "bench"),
            aws_secret_access_key=self.spec.get("secret", "bench"),
            config=Config(max_pool_connections=self.inflight + 2,
                          retries={"max_attempts": 1}, read_timeout=60))
        await self._call(self.sqs.list_queues)

    async def _call(self, fn: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, lambda: fn(**kwargs))

    async def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def create_queue(self, name: str, fifo: bool) -> str:
        attrs = {"VisibilityTimeout": str(VISIBILITY_TIMEOUT_S)}
        if fifo:
            attrs["FifoQueue"] = "true"
            name += ".fifo"
        resp = await self._call(self.sqs.create_queue, QueueName=name, Attributes=attrs)
        return resp["QueueUrl"]

    async def delete_queue(self, ref: str) -> None:
        await self._call(self.sqs.delete_queue, QueueUrl=ref)

    async def depth(self, ref: str) -> int | None:
        resp = await self._call(self.sqs.get_queue_attributes, QueueUrl=ref,
                                AttributeNames=["ApproximateNumberOfMessages"])
        return int(resp["Attributes"]["ApproximateNumberOfMessages"])

    async def send(self, ref: str, bodies: list[str], groups: list[str | None]) -> None:
        if len(bodies) == 1:
            await self._call(self.sqs.send_message, QueueUrl=ref, MessageBody=bodies[0],
                             **_fifo_fields(groups[0]))
            return
        entries = [{"Id": str(i), "MessageBody": b, **_fifo_fields(g)}
                   for i, (b, g) in enumerate(zip(bodies, groups, strict=True))]
        resp = await self._call(self.sqs.send_message_batch, QueueUrl=ref, Entries=entries)
        if resp.get("Failed"):
            raise RuntimeError(f"{len(resp['Failed'])} entries failed: {resp['Failed'][0]}")

    async def receive(self, ref: str, n: int, wait_s: int) -> list[Any]:
        resp = await self._call(self.sqs.receive_message, QueueUrl=ref,
                                MaxNumberOfMessages=n, WaitTimeSeconds=wait_s)
        return [m["ReceiptHandle"] for m in resp.get("Messages", [])]

    async def delete(self, ref: str, msgs: list[Any]) -> None:
        if len(msgs) == 1:
            await self._call(self.sqs.delete_message, QueueUrl=ref, ReceiptHandle=msgs[0])
            return
        resp = await self._call(
            self.sqs.delete_message_batch, QueueUrl=ref,
            Entries=[{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(msgs)])
        if resp.get("Failed"):
            raise RuntimeError(f"{len(resp['Failed'])} deletes failed: {resp['Failed'][0]}")


def make_driver(spec: dict[str, Any], inflight: int = 16) -> Driver:
    """The driver for a spec's ``kind``."""
    kind = spec["kind"]
    if kind == "sqsq-grpc":
        return SqsqGrpcDriver(spec, inflight)
    if kind == "boto3":
        return Boto3Driver(spec, inflight)
    if kind == "nats":
        from bench.peer_drivers import NatsDriver

        return NatsDriver(spec, inflight)
    if kind == "rabbitmq":
        from bench.peer_drivers import RabbitDriver

        return RabbitDriver(spec, inflight)
    raise ValueError(f"unknown driver kind {kind!r}")
