"""Drivers for the non-SQS peers: NATS JetStream (nats-py) and RabbitMQ (aio-pika).

NATS: a work-queue stream on file storage, one durable pull consumer with explicit acks and
``ack_wait`` = the SQS visibility timeout; a publish waits for the stream's ack, a delete is
``ack_sync`` (waits for the server), batches are 10 concurrent calls (JetStream has no batch
publish). RabbitMQ: a durable quorum queue, publisher confirms awaited per message, a consumer
with a prefetch window and manual acks (an AMQP ack has no reply, so its latency is the
client's write only; the receive latency is the wait on the prefetch buffer).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from bench.drivers import VISIBILITY_TIMEOUT_S, Driver

CONSUMER = "bench"


class NatsDriver(Driver):
    supports_fifo = False

    async def open(self) -> None:
        import nats

        self.nc = await nats.connect(servers=self.spec["servers"], connect_timeout=10,
                                     max_reconnect_attempts=3)
        self.js = self.nc.jetstream(timeout=30)
        self._subs: dict[str, asyncio.Queue] = {}

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.close()

    async def create_queue(self, name: str, fifo: bool) -> str:
        from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType

        await self.js.add_stream(name=name, subjects=[name], storage=StorageType.FILE,
                                 retention=RetentionPolicy.WORK_QUEUE,
                                 num_replicas=self.spec.get("replicas", 1))
        await self.js.add_consumer(name, ConsumerConfig(
            durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT,
            ack_wait=VISIBILITY_TIMEOUT_S, max_ack_pending=100_000, max_waiting=1024))
        return name

    async def delete_queue(self, ref: str) -> None:
        await self.js.delete_stream(ref)

    async def depth(self, ref: str) -> int | None:
        return (await self.js.stream_info(ref)).state.messages

    async def send(self, ref: str, bodies: list[str], groups: list[str | None]) -> None:
        await asyncio.gather(*(self.js.publish(ref, b.encode()) for b in bodies))

    async def _sub(self, ref: str) -> Any:
        pool = self._subs.setdefault(ref, asyncio.Queue())
        if pool.empty():
            return await self.js.pull_subscribe(ref, durable=CONSUMER, stream=ref)
        return pool.get_nowait()

    async def receive(self, ref: str, n: int, wait_s: int) -> list[Any]:
        import nats.errors

        sub = await self._sub(ref)
        try:
            return await sub.fetch(n, timeout=max(wait_s, 0.05))
        except nats.errors.TimeoutError:
            return []
        finally:
            self._subs[ref].put_nowait(sub)

    async def delete(self, ref: str, msgs: list[Any]) -> None:
        await asyncio.gather(*(m.ack_sync() for m in msgs))


class RabbitDriver(Driver):
    supports_fifo = False

    async def open(self) -> None:
        import aio_pika

        self.aio_pika = aio_pika
        self.conn = await aio_pika.connect(self.spec["url"], timeout=30)
        self.pub = await self.conn.channel(publisher_confirms=True)
        self._buffers: dict[str, asyncio.Queue] = {}

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.conn.close()

    async def create_queue(self, name: str, fifo: bool) -> str:
        await self.pub.declare_queue(name, durable=True,
                                     arguments={"x-queue-type": "quorum"})
        return name

    async def delete_queue(self, ref: str) -> None:
        await self.pub.queue_delete(ref)

    async def depth(self, ref: str) -> int | None:
        q = await self.pub.declare_queue(ref, passive=True)
        return q.declaration_result.message_count

    async def send(self, ref: str, bodies: list[str], groups: list[str | None]) -> None:
        mode = self.aio_pika.DeliveryMode.PERSISTENT
        ex = self.pub.default_exchange
        await asyncio.gather(*(
            ex.publish(self.aio_pika.Message(b.encode(), delivery_mode=mode), routing_key=ref)
            for b in bodies))

    async def _buffer(self, ref: str) -> asyncio.Queue:
        buf = self._buffers.get(ref)
        if buf is None:
            buf = self._buffers[ref] = asyncio.Queue()
            chan = await self.conn.channel()
            await chan.set_qos(prefetch_count=self.spec.get("prefetch", 10 * self.inflight * 2))
            queue = await chan.declare_queue(ref, passive=True)
            await queue.consume(buf.put, no_ack=False)
        return buf

    async def receive(self, ref: str, n: int, wait_s: int) -> list[Any]:
        buf = await self._buffer(ref)
        try:
            first = await asyncio.wait_for(buf.get(), timeout=max(wait_s, 0.05))
        except TimeoutError:
            return []
        out = [first]
        while len(out) < n and not buf.empty():
            out.append(buf.get_nowait())
        return out

    async def delete(self, ref: str, msgs: list[Any]) -> None:
        for m in msgs:
            await m.ack()
