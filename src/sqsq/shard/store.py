"""Ordered byte-key stores under the queue state machine.

`RocksStore` is the durable one (RocksDB via rocksdict, raw byte keys);
`MemoryStore` is its in-memory twin with the same semantics, for tests and
ephemeral queues. Both expose lazy range scans that survive concurrent writes.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator, Mapping
from itertools import islice
from typing import Protocol

from rocksdict import (
    BlockBasedOptions,
    Checkpoint,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)
from sortedcontainers import SortedDict

from sqsq.core.txn import KVReader

__all__ = ["Store", "MemoryStore", "RocksStore"]


class Store(KVReader, Protocol):
    def write(self, writes: Mapping[bytes, bytes | None], *, sync: bool) -> None:
        """Apply puts (bytes) and deletes (None) as one atomic batch."""
        ...

    def sync(self) -> None:
        """Make every write so far durable (fsync the write-ahead log)."""
        ...

    def checkpoint(self, path: str) -> None:
        """Consistent point-in-time copy at `path` (which must not exist)."""
        ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------
# In-memory twin
# --------------------------------------------------------------------------

_MEM_MAGIC = b"SQSQMEM1"
_LEN = struct.Struct(">I")


class MemoryStore:
    """SortedDict-backed store with the same semantics as RocksStore.

    A lock makes each batch atomic with respect to readers on other threads
    (scans read in small chunks under it). `sync` is accepted and ignored.
    """

    _CHUNK_MIN = 16
    _CHUNK_MAX = 512

    def __init__(self) -> None:
        self._d: SortedDict = SortedDict()
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def load(cls, path: str) -> MemoryStore:
        """Open a file written by `checkpoint`."""
        store = cls()
        with open(path, "rb") as f:
            data = f.read()
        if not data.startswith(_MEM_MAGIC):
            raise ValueError(f"{path}: not a MemoryStore checkpoint")
        pos, n, d = len(_MEM_MAGIC), len(data), store._d
        while pos < n:
            (klen,) = _LEN.unpack_from(data, pos)
            pos += 4
            key = data[pos : pos + klen]
            pos += klen
            (vlen,) = _LEN.unpack_from(data, pos)
            pos += 4
            value = data[pos : pos + vlen]
            pos += vlen
            if len(key) != klen or len(value) != vlen:
                raise ValueError(f"{path}: truncated checkpoint")
            d[key] = value
        return store

    def _check(self) -> None:
        if self._closed:
            raise RuntimeError("store is closed")

    def get(self, key: bytes) -> bytes | None:
        self._check()
        return self._d.get(key)

    def write(self, writes: Mapping[bytes, bytes | None], *, sync: bool) -> None:
        self._check()
        d = self._d
        with self._lock:
            for k, v in writes.items():
                if v is None:
                    d.pop(k, None)
                else:
                    d[k] = v

    def sync(self) -> None:
        self._check()  # nothing to make durable: memory is the twin for tests

    def scan(
        self, start: bytes, end: bytes, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        """Lazy: reads chunks (growing from 16 to 512 pairs) and resumes each
        chunk after the last key seen, so writes between chunks cannot break the
        iteration (they may or may not be seen)."""
        self._check()
        d = self._d
        lo, hi = start, end
        lo_incl = True  # the end bound is always exclusive
        chunk = self._CHUNK_MIN
        while lo < hi:
            with self._lock:
                ks = list(islice(d.irange(lo, hi, (lo_incl, False), reverse), chunk))
                items = [(k, d[k]) for k in ks]
            yield from items
            if len(ks) < chunk:
                return
            if reverse:
                hi = ks[-1]
            else:
                lo, lo_incl = ks[-1], False
            chunk = min(chunk * 2, self._CHUNK_MAX)

    def checkpoint(self, path: str) -> None:
        """Write length-prefixed records to a file that `MemoryStore.load` opens."""
        self._check()
        if os.path.exists(path):
            raise FileExistsError(path)
        with self._lock:  # point-in-time copy of the (immutable bytes) pairs
            pairs = list(self._d.items())
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(_MEM_MAGIC)
            for k, v in pairs:
                f.write(_LEN.pack(len(k)))
                f.write(k)
                f.write(_LEN.pack(len(v)))
                f.write(v)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def close(self) -> None:
        self._closed = True


# --------------------------------------------------------------------------
# RocksDB
# --------------------------------------------------------------------------


class RocksStore:
    """RocksDB store through rocksdict in raw (bytes) mode.

    Scans use an iterator bounded above by `iterate_upper_bound = end`; an
    iterator reads an implicit snapshot, so writes during a scan are not seen
    and cannot break it. rocksdict 0.3.29's `set_iterate_lower_bound` sets the
    *upper* bound instead (observed), so the lower bound is enforced in Python.
    """

    def __init__(self, path: str) -> None:
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        # Bloom filters, on the SSTs and in the memtable: a replica looks up keys that are
        # usually absent (a send's deduplication id or request id), and without a filter each
        # such read searched the memtables and then every L0 file's index (2 us of a send's
        # 15 here). Only what is written from now on gets them: older SSTs read as before.
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        opts.set_memtable_prefix_bloom_ratio(0.01)  # of the write buffer: 640 KiB a shard
        opts.set_memtable_whole_key_filtering(True)
        self.path = path
        self._db = Rdict(path, opts)
        # Reads go straight to rocksdict's (a missing key is None): a replica reads a few
        # records per message, and this method's own frame was a third of a read's cost.
        self.get = self._db.get  # type: ignore[method-assign]
        self._sync_opts = WriteOptions()
        self._sync_opts.sync = True
        self._nosync_opts = WriteOptions()
        self._closed = False

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def write(self, writes: Mapping[bytes, bytes | None], *, sync: bool) -> None:
        wb = WriteBatch(raw_mode=True)
        put, delete = wb.put, wb.delete
        for k, v in writes.items():
            if v is None:
                delete(k)
            else:
                put(k, v)
        self._db.write(wb, self._sync_opts if sync else self._nosync_opts)

    def sync(self) -> None:
        # FlushWAL(sync): rocksdict releases the GIL here, unlike write() with sync=True,
        # so the engine can apply the next group while this fsync runs.
        self._db.flush_wal(True)

    def scan(
        self, start: bytes, end: bytes, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        if start >= end:
            return
        ro = ReadOptions()
        ro.set_iterate_upper_bound(end)
        # key checks below are cheap and keep us correct even if a bound is ignored
        if reverse:
            it = self._db.iter(ro)
            it.seek_for_prev(end)
            if it.valid() and it.key() >= end:
                it.prev()
            while it.valid():
                k = it.key()
                if k < start:
                    return
                yield k, it.value()
                it.prev()
        else:
            it = self._db.iter(ro)
            it.seek(start)
            while it.valid():
                k = it.key()
                if k >= end:
                    return
                yield k, it.value()
                it.next()

    def checkpoint(self, path: str) -> None:
        """RocksDB checkpoint (hard-linked SSTs + WAL); open it with RocksStore(path)."""
        if os.path.exists(path):  # same error as MemoryStore, not RocksDB's bare Exception
            raise FileExistsError(path)
        # A checkpoint flushes the memtable holding the GIL (86 ms for 40 MB here, every
        # thread stopped); a flush first does the same work with the GIL released.
        self._db.flush(True)
        Checkpoint(self._db).create_checkpoint(path)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._db.close()
