"""The store a replica's state machine reads and writes, behind one indirection: installing a
snapshot swaps the store behind it whole, while reads on other threads wait for nothing
closed (``CurrentStore``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from sqsq.shard.store import MemoryStore, RocksStore, Store


def open_store(path: Path, memory: bool = False) -> Store:
    """The store at ``path``: a RocksDB directory, or a MemoryStore (loaded from its
    checkpoint file if there is one)."""
    if memory:
        return MemoryStore.load(str(path)) if path.is_file() else MemoryStore()
    return RocksStore(str(path))


class Installing(RuntimeError):
    """The store is being replaced by a snapshot's: read again in a moment."""


class CurrentStore:
    """The store, through one indirection: installing a snapshot swaps what is behind it.

    Reads from worker threads (the leader's queries and looks) run inside
    ``reading()``; the swap (``swapping()``, closing the old store and opening the new)
    waits for those under way and refuses new ones with ``Installing`` until it is done,
    so no read ever touches a closed RocksDB handle, and none blocks the event loop for
    the length of an install."""

    def __init__(self, store: Store) -> None:
        self.inner = store
        self._lock = threading.Lock()  # taken directly by reads: Condition's methods are Python
        self._guard = threading.Condition(self._lock)
        self._readers = 0
        self._swapping = False
        self._reading = _Reading(self)

    def reading(self) -> AbstractContextManager[None]:
        """A read's guard (``with store.reading(): ...``): a plain object, not a generator's
        context manager, which cost a receive on the leader's loop 2 us more."""
        return self._reading

    def _enter_reading(self) -> None:
        with self._lock:
            if self._swapping:
                raise Installing("the replica is installing a snapshot")
            self._readers += 1

    def _exit_reading(self) -> None:
        with self._lock:
            self._readers -= 1
            if not self._readers and self._swapping:  # set under this lock before it waits
                self._guard.notify_all()

    @contextmanager
    def swapping(self) -> Iterator[None]:
        with self._guard:
            self._swapping = True
            while self._readers:
                self._guard.wait()
        try:
            yield
        finally:
            with self._guard:
                self._swapping = False

    def get(self, key: bytes) -> bytes | None:
        return self.inner.get(key)

    def scan(self, start: bytes, end: bytes, *, reverse: bool = False
             ) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.scan(start, end, reverse=reverse)

    def write(self, writes: Mapping[bytes, bytes | None], *, sync: bool) -> None:
        self.inner.write(writes, sync=sync)

    def sync(self) -> None:
        self.inner.sync()

    def checkpoint(self, path: str) -> None:
        self.inner.checkpoint(path)

    def close(self) -> None:
        self.inner.close()


class _Reading:
    """``CurrentStore.reading``'s guard: one per store, holding no state of its own (the
    count of readers is the store's), so reads on several threads share it."""

    __slots__ = ("_store",)

    def __init__(self, store: CurrentStore) -> None:
        self._store = store

    def __enter__(self) -> None:
        self._store._enter_reading()

    def __exit__(self, *exc: object) -> None:
        self._store._exit_reading()
