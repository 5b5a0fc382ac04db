"""Receive prefetch: a consumer helper that receives ahead and hands messages out one by one.

    with client.prefetcher(url, buffer=10) as inbox:      # AsyncClient: async with / await
        for m in inbox:                                   # or inbox.receive(1, 20)
            handle(m)
            client.delete_message(url, m.receipt_handle)

When its buffer is empty, a ``receive`` asks the queue for up to ``buffer`` messages (at most
10, SQS's limit for one ReceiveMessage) and keeps what it does not hand out yet, so a consumer
that takes one message at a time makes one ReceiveMessage per ``buffer`` messages.

A held message is invisible to other consumers only until its visibility timeout runs out,
counted from when its ReceiveMessage was sent. A message with less than ``safety_margin_s``
of it left is never handed out: it is dropped (the queue delivers it again once its timeout
runs out), and counted in ``dropped``. ``close`` releases what is still held (visibility set
to 0, in batch calls), so other consumers can receive it at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from sqsq.client.types import Message
from sqsq.errors import error_for

if TYPE_CHECKING:
    from sqsq.client.aio import AsyncClient
    from sqsq.client.sync import Client

MAX_BUFFER = 10  # one ReceiveMessage returns at most 10 messages
DEFAULT_WAIT_S = 20  # SQS's longest long poll
MARGIN_SHARE = 0.2  # default safety margin: this share of the visibility timeout


class _Held:
    """The buffer: messages with their visibility deadline (on ``clock``), oldest first."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.items: deque[tuple[Message, float]] = deque()
        self.dropped = 0

    def add(self, messages: Iterable[Message], deadline: float) -> None:
        self.items.extend((m, deadline) for m in messages)

    def take(self, n: int, margin_s: float) -> list[Message]:
        """Up to ``n`` messages with more than ``margin_s`` of visibility left; the stale
        ones met on the way are dropped."""
        out: list[Message] = []
        now = self.clock()
        while self.items and len(out) < n:
            message, deadline = self.items.popleft()
            if deadline - now > margin_s:
                out.append(message)
            else:
                self.dropped += 1
        return out

    def drain(self) -> list[Message]:
        out = [m for m, _ in self.items]
        self.items.clear()
        return out


def _check(buffer: int, visibility_timeout: int | None, margin_s: float | None) -> None:
    if not 1 <= buffer <= MAX_BUFFER:
        raise error_for("InvalidParameterValue", f"Value {buffer} for parameter buffer is "
                        f"invalid. Reason: Must be between 1 and {MAX_BUFFER}.")
    if visibility_timeout is not None:
        _margin(visibility_timeout, margin_s)


def _margin(visibility_timeout: int, margin_s: float | None) -> float:
    """The safety margin in force for ``visibility_timeout``; it must leave some time."""
    if visibility_timeout < 1:
        raise error_for("InvalidParameterValue", "A prefetcher needs a visibility timeout of "
                        f"at least 1 second (it is {visibility_timeout}).")
    margin = visibility_timeout * MARGIN_SHARE if margin_s is None else float(margin_s)
    if not 0 <= margin < visibility_timeout:
        raise error_for("InvalidParameterValue", f"Value {margin_s} for parameter "
                        "safety_margin_s is invalid. Reason: Must be at least 0 and less than "
                        f"the visibility timeout ({visibility_timeout} s).")
    return margin


def _release_entries(messages: list[Message]) -> list[list[dict[str, object]]]:
    entries = [{"Id": str(i), "ReceiptHandle": m.receipt_handle, "VisibilityTimeout": 0}
               for i, m in enumerate(messages)]
    return [entries[i:i + 10] for i in range(0, len(entries), 10)]


class _PrefetcherBase:
    """What both prefetchers are given (see ``Client.prefetcher``), and what they report."""

    def __init__(
        self, client: Any, queue: str, *, buffer: int = MAX_BUFFER,
        visibility_timeout: int | None = None, wait_time_seconds: int = DEFAULT_WAIT_S,
        safety_margin_s: float | None = None,
        attribute_names: Iterable[str] | str | None = None,
        message_attribute_names: Iterable[str] | str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check(buffer, visibility_timeout, safety_margin_s)
        self.client = client
        self.queue = queue
        self.buffer = buffer
        self.visibility_timeout = visibility_timeout
        self.wait_time_seconds = wait_time_seconds
        self.safety_margin_s = safety_margin_s
        self._attrs = attribute_names
        self._mattrs = message_attribute_names
        self._held = _Held(clock)

    @property
    def buffered(self) -> int:
        """How many messages are held (some may be too close to their timeout to hand out)."""
        return len(self._held.items)

    @property
    def dropped(self) -> int:
        """How many held messages were dropped for want of visibility time left."""
        return self._held.dropped


class Prefetcher(_PrefetcherBase):
    """Prefetch for the blocking ``Client`` (see the module's docstring); safe to share
    between threads (they take turns fetching). Made by ``Client.prefetcher``."""

    def __init__(self, client: Client, queue: str, **settings: Any) -> None:
        super().__init__(client, queue, **settings)
        self._lock = threading.Lock()  # the buffer
        self._fetching = threading.Lock()  # one ReceiveMessage at a time
        self._closed = False

    def _timeout(self) -> int:
        if self.visibility_timeout is None:  # the queue's, looked up once
            attrs = self.client.get_queue_attributes(self.queue, ["VisibilityTimeout"])
            self.visibility_timeout = int(attrs["VisibilityTimeout"])
        return self.visibility_timeout

    def receive(self, max_number_of_messages: int = 1,
                wait_time_seconds: int | None = None) -> list[Message]:
        """Up to ``max_number_of_messages`` held messages; when none is held, one
        ReceiveMessage for up to ``buffer`` (long polling ``wait_time_seconds``, default the
        prefetcher's). Empty once closed."""
        with self._fetching:
            timeout = self._timeout()
            margin = _margin(timeout, self.safety_margin_s)
            with self._lock:
                out = self._held.take(max_number_of_messages, margin)
                if out or self._closed:
                    return out
            sent_at = self._held.clock()
            got = self.client.receive_message(
                self.queue, self.buffer, timeout,
                self.wait_time_seconds if wait_time_seconds is None else wait_time_seconds,
                self._attrs, self._mattrs)
            with self._lock:
                if not self._closed:
                    self._held.add(got, sent_at + timeout)
                    return self._held.take(max_number_of_messages, margin)
            self._release(got)  # closed while this receive was under way
            return []

    def __iter__(self) -> Iterator[Message]:
        """Messages one by one, long polling, until closed."""
        while not self._closed:
            yield from self.receive(1)

    def close(self) -> None:
        """Release the held messages (visibility 0): other consumers get them at once."""
        with self._lock:
            self._closed = True
            held = self._held.drain()
        self._release(held)

    def _release(self, messages: list[Message]) -> None:
        # A failed entry (its timeout already ran out, or it was received again) is not ours
        # to release any more: nothing to do.
        for chunk in _release_entries(messages):
            self.client.change_message_visibility_batch(self.queue, chunk)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncPrefetcher(_PrefetcherBase):
    """Prefetch for ``AsyncClient`` (see the module's docstring): ``await receive(...)``,
    ``async for``, ``await close()``. Made by ``AsyncClient.prefetcher``."""

    def __init__(self, client: AsyncClient, queue: str, **settings: Any) -> None:
        super().__init__(client, queue, **settings)
        self._fetching: asyncio.Lock | None = None  # made on the loop that first receives
        self._closed = False

    async def _timeout(self) -> int:
        if self.visibility_timeout is None:  # the queue's, looked up once
            attrs = await self.client.get_queue_attributes(self.queue, ["VisibilityTimeout"])
            self.visibility_timeout = int(attrs["VisibilityTimeout"])
        return self.visibility_timeout

    async def receive(self, max_number_of_messages: int = 1,
                      wait_time_seconds: int | None = None) -> list[Message]:
        """Up to ``max_number_of_messages`` held messages; when none is held, one
        ReceiveMessage for up to ``buffer`` (long polling ``wait_time_seconds``, default the
        prefetcher's). Empty once closed."""
        if self._fetching is None:
            self._fetching = asyncio.Lock()
        async with self._fetching:
            timeout = await self._timeout()
            margin = _margin(timeout, self.safety_margin_s)
            out = self._held.take(max_number_of_messages, margin)
            if out or self._closed:
                return out
            sent_at = self._held.clock()
            got = await self.client.receive_message(
                self.queue, self.buffer, timeout,
                self.wait_time_seconds if wait_time_seconds is None else wait_time_seconds,
                self._attrs, self._mattrs)
            if not self._closed:
                self._held.add(got, sent_at + timeout)
                return self._held.take(max_number_of_messages, margin)
            await self._release(got)  # closed while this receive was under way
            return []

    async def __aiter__(self) -> AsyncIterator[Message]:
        """Messages one by one, long polling, until closed."""
        while not self._closed:
            for m in await self.receive(1):
                yield m

    async def close(self) -> None:
        """Release the held messages (visibility 0): other consumers get them at once."""
        self._closed = True
        await self._release(self._held.drain())

    async def _release(self, messages: list[Message]) -> None:
        # A failed entry (its timeout already ran out, or it was received again) is not ours
        # to release any more: nothing to do.
        for chunk in _release_entries(messages):
            await self.client.change_message_visibility_batch(self.queue, chunk)

    async def __aenter__(self) -> AsyncPrefetcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
