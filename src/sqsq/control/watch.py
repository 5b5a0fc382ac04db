"""A watch on a key range that survives etcd restarts and never stops by itself.

etcd's watch stream ends whenever the connection does (an etcd restart, a network blip, a
frozen server caught by keepalive pings). This watch then opens a new stream from the
revision after the last one it delivered, so the consumer sees every change exactly once and
in order. If that history was compacted meanwhile, it reads the whole range again and hands
the consumer a ``reset`` batch to replace what it holds. Only ``close()`` ends the iteration;
a bug in the reader task is re-raised to the consumer rather than swallowed.

Batches keep etcd's grouping: one batch never splits a revision, so a consumer applying a
batch at a time always holds a state that existed in etcd (one transaction is one revision).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from aetcd import rpc
from aetcd.rpc import rpc_pb2

from sqsq.control.etcd import Etcd, EtcdError, KeyValue, RangeResult, prefix_range_end

log = logging.getLogger(__name__)

MAX_BUFFERED_BATCHES = 10_000  # a stalled consumer stops the stream (flow control) here
MAX_BACKOFF_S = 2.0


@dataclass(frozen=True)
class WatchEvent:
    key: str
    kv: KeyValue | None  # the new value; None for a delete
    mod_revision: int

    @property
    def deleted(self) -> bool:
        return self.kv is None


@dataclass(frozen=True)
class WatchBatch:
    revision: int  # every change up to and including this revision has been delivered
    events: tuple[WatchEvent, ...] = ()
    reset: RangeResult | None = None  # history was compacted: this is the whole range now


class _Closed:
    pass


class Watch:
    """Iterate with ``async for batch in watch``; ``await watch.close()`` to stop."""

    def __init__(self, etcd: Etcd, key: str, range_end: bytes, start_revision: int) -> None:
        if start_revision <= 0:
            # Resuming needs a known revision: read the range first, watch from its revision+1.
            raise ValueError("start_revision must come from a read (its revision + 1)")
        self.etcd = etcd
        self.key = key
        self.range_end = range_end
        self.next_revision = start_revision
        self.connected = False  # a stream is open and created
        self.restarts = 0  # streams reopened after an error
        self.last_error: str | None = None
        self._queue: asyncio.Queue[WatchBatch | _Closed | BaseException] = asyncio.Queue(
            MAX_BUFFERED_BATCHES)
        self._closed = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def __aiter__(self) -> AsyncIterator[WatchBatch]:
        return self

    async def __anext__(self) -> WatchBatch:
        item = await self._queue.get()
        if isinstance(item, _Closed):
            self._queue.put_nowait(item)  # later calls end too
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    async def close(self) -> None:
        self._closed = True
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        # Drop what the consumer will never read, then mark the end.
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(_Closed())

    async def _run(self) -> None:
        delay_s = 0.05
        try:
            while not self._closed:
                started = time.monotonic()
                try:
                    await self.etcd.wait_connected(time.monotonic() + MAX_BACKOFF_S)
                    await self._stream()
                    error = "the watch stream ended"
                except grpc.aio.AioRpcError as exc:
                    error = f"{exc.code().name}: {exc.details()}"
                except EtcdError as exc:
                    error = str(exc)
                self.connected = False
                self.restarts += 1
                self.last_error = error
                log.info("watch %s: %s; resuming from revision %d",
                         self.key, error, self.next_revision)
                if time.monotonic() - started > 5:
                    delay_s = 0.05  # the stream had worked for a while: retry at once
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, MAX_BACKOFF_S)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: hand it to the consumer, do not go quiet
            log.exception("watch %s failed", self.key)
            await self._queue.put(exc)

    async def _stream(self) -> None:
        create = rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
            key=self.key.encode(), range_end=self.range_end,
            start_revision=self.next_revision, progress_notify=True))
        hold_open = asyncio.Event()  # never set: the request side stays open until cancel

        async def requests():  # noqa: ANN202
            yield create
            await hold_open.wait()

        call = self.etcd.watches.Watch(requests())
        try:
            async for resp in call:
                if resp.compact_revision:
                    await self._resync(resp.compact_revision)
                    return
                if resp.canceled:
                    raise EtcdError(f"watch canceled by etcd: {resp.cancel_reason}")
                if resp.created:
                    self.connected = True
                if resp.events:
                    events = tuple(_event(ev) for ev in resp.events)
                    last = max(ev.mod_revision for ev in events)
                    self.next_revision = last + 1
                    await self._queue.put(WatchBatch(last, events))
                elif not resp.created and resp.header.revision >= self.next_revision:
                    # A progress notice: nothing in the range changed up to this revision.
                    self.next_revision = resp.header.revision + 1
        finally:
            call.cancel()

    async def _resync(self, compact_revision: int) -> None:
        log.warning("watch %s: history compacted at %d (wanted %d); reading the range again",
                    self.key, compact_revision, self.next_revision)
        snapshot = await self.etcd.range(self.key, self.range_end)
        self.next_revision = snapshot.revision + 1
        await self._queue.put(WatchBatch(snapshot.revision, reset=snapshot))


def _event(ev: Any) -> WatchEvent:
    if ev.type == rpc.Event.DELETE:
        return WatchEvent(ev.kv.key.decode(), None, ev.kv.mod_revision)
    kv = KeyValue.from_pb(ev.kv)
    return WatchEvent(kv.key, kv, kv.mod_revision)


def watch_prefix(etcd: Etcd, prefix: str, start_revision: int) -> Watch:
    """Every change under ``prefix`` from ``start_revision`` on (a read's revision + 1)."""
    return Watch(etcd, prefix, prefix_range_end(prefix), start_revision)


def watch_key(etcd: Etcd, key: str, start_revision: int) -> Watch:
    return Watch(etcd, key, b"", start_revision)
