"""The Raft journal made durable: pysyncobj's ``FileJournal``, synced before anything depends
on it (fix 1 in ``sqsq.shard.raft``, which decides when), and written with ``pwrite``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pysyncobj.journal import FileJournal


def fsync_path(path: str | Path, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _JournalFile:
    """pysyncobj's journal file (a ``ResizableFile``), written with ``pwrite`` on our own
    descriptor instead of through its shared mmap, which still serves reads and growth.

    A page dirtied through a shared mapping is write-protected again by every flush (a TLB
    shootdown when the process's threads run on both cores) and faults on its next write;
    a page dirtied by ``pwrite`` is only dirty in the page cache, which the mapping shares.
    (One-message entries, this machine: the leader's flush 160 against 195-200 us.) The
    file's size is kept here instead of asked of the map (an fstat) on every write."""

    def __init__(self, inner: Any, fd: int) -> None:
        self._inner = inner
        self._fd = fd
        self._size = os.fstat(fd).st_size

    def write(self, offset: int, values: bytes) -> None:
        if offset + len(values) > self._size:
            self._inner.write(offset, values)  # grows the file and its map, writes once
            self._size = os.fstat(self._fd).st_size
        else:
            os.pwrite(self._fd, values, offset)

    def read(self, offset: int, size: int) -> bytes:
        return self._inner.read(offset, size)

    def flush(self) -> None:  # FileJournal.flush (pysyncobj itself never calls it)
        self._inner.flush()

    def _destroy(self) -> None:
        self._inner._destroy()


class DurableJournal(FileJournal):
    """pysyncobj's file journal, made durable: ``sync`` flushes to disk what ``add`` wrote;
    term and vote are fsynced as soon as they are stored.

    The flush is ``fdatasync`` on a descriptor of our own, not ``mmap.flush``: CPython 3.11's
    ``mmap.flush`` holds the GIL through the msync of the whole mapping, stalling the event
    loop once per entry, while ``os.fdatasync`` releases it and walks only the dirty pages.
    ``add`` writes through that descriptor as well (see ``_JournalFile``). pysyncobj never
    replaces the journal file, so the descriptor stays valid."""

    def __init__(self, journal_file: str) -> None:
        super().__init__(journal_file)
        self.path = journal_file
        self._fd = os.open(journal_file, os.O_RDWR | os.O_CLOEXEC)
        self._FileJournal__journalFile = _JournalFile(self._FileJournal__journalFile, self._fd)
        self.dirty = False
        self.syncs = 0
        self.synced_index = self[-1][1] if len(self) else 0  # last index known durable
        self.on_sync: Callable[[float], None] | None = None  # seconds per flush (metrics)

    def add(self, command: bytes, idx: int, term: int) -> None:
        super().add(command, idx, term)
        self.dirty = True

    def clear(self) -> None:
        super().clear()
        self.dirty = True

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 - pysyncobj's name
        super().deleteEntriesFrom(entryFrom)
        self.dirty = True

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802 - pysyncobj's name
        # Compaction: the dump that replaces these entries was renamed into place; make the
        # rename durable before the entries it replaces can disappear.
        fsync_path(os.path.dirname(os.path.abspath(self.path)), directory=True)
        super().deleteEntriesTo(entryTo)
        self.dirty = True

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802, N803
        super().setCurrentTerm(term, votedForNodeId)
        fsync_path(self.path + ".meta")
        fsync_path(os.path.dirname(os.path.abspath(self.path)), directory=True)

    def _destroy(self) -> None:
        super()._destroy()
        os.close(self._fd)

    def sync(self) -> None:
        if self.dirty:
            started = time.perf_counter()
            os.fdatasync(self._fd)  # entries and the end-of-log header (see the class doc)
            self.dirty = False
            self.syncs += 1
            if self.on_sync is not None:
                self.on_sync(time.perf_counter() - started)
        self.synced_index = self[-1][1] if len(self) else 0


def create_journal(journal_file: str | None) -> Any:
    if journal_file is None:
        raise ValueError("a sqsq replica always has a journal file")
    return DurableJournal(journal_file)
