"""The durable Raft log of one replica: append-only segment files, a checksum per record.

Records (``raftrecord``) carry a checksum each; the payload is msgpack, never pickle. Each
segment file holds a run of consecutive indexes and is named by its first
(``00000000000000000001.log``); a new one is started once the active one passes
``segment_bytes``.

What a crash can leave, and what ``open`` does with it:

- zeros after the last record of the last segment: space allocated ahead of the data
  (``PREALLOCATE_BYTES`` at a time, so that most syncs after an append need not also
  journal the file's growth: 76-79 against 113-126 us an fdatasync here);
- a torn last record (the process or the machine died inside a write that was never
  synced, so nothing was acknowledged on it): cut off, the file truncated there and fsynced;
- a bad record anywhere else: ``CorruptLog``. Data that was synced went bad; reading past it
  would serve or drop entries this replica acknowledged, so the replica must not start.

Compaction unlinks whole segments, oldest first, and never rewrites a file that holds live
entries (pysyncobj cleared its journal and re-added the kept entries, so a crash in between
lost them: finding 1). Truncation happens only where the core asks (a conflict), newest
segment first, and is made durable before anything is written after it, so a crash never
leaves new entries followed by the old ones they replaced.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from sqsq.raft import Entry, EntryKind
from sqsq.shard.durable import fsync_dir, make_dir, pwrite_all
from sqsq.shard.raftrecord import BASE_KIND, BadRecord, encode_record, is_torn, records

log = logging.getLogger("sqsq.shard")
T = TypeVar("T")

SEGMENT_BYTES = 64 << 20
# Allocated ahead of the data, a chunk at a time: a node with many replicas reserves this
# much (not a whole segment) each.
PREALLOCATE_BYTES = 4 << 20
_NAME = re.compile(r"^(\d{20})\.log$")
_KINDS = {int(k): k for k in EntryKind}  # an enum call per entry costs a restart ~1 us each


class CorruptLog(Exception):
    """The log is damaged where a crash cannot have damaged it; the replica must stop."""


def _advice(path: Path, offset: int, index: int, reason: str) -> str:
    return (f"{path}: {reason} at offset {offset} (where entry {index} should be). The Raft "
            f"log is damaged before its end, so entries this replica acknowledged may be "
            f"lost; it will not start. Restore its data directory from a backup, or replace "
            f"the replica (remove it from the group and add a new one with an empty disk)")


@dataclass(eq=False)
class _Segment:
    first: int  # the index the file is named by: its first record's
    path: Path
    # Per record: its byte offset and its term (8 bytes each, no entry data: a million
    # entries cost 16 MB; compaction keeps the count bounded).
    offsets: array[int] = field(default_factory=lambda: array("q"))
    terms: array[int] = field(default_factory=lambda: array("q"))
    size: int = 0  # where the data ends
    allocated: int = 0  # the file's size: zeros from ``size`` on
    fd: int | None = None  # open while it is the active segment or holds unsynced writes

    def last(self) -> int:
        return self.first + len(self.offsets) - 1

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class SegmentedLog:
    """One replica's log. Not thread-safe: the host appends, syncs, truncates and compacts
    from one thread at a time (the sync may run in a worker while nothing else touches it)."""

    def __init__(self, directory: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self._segments: list[_Segment] = []
        self._firsts: list[int] = []  # each segment's first index, for bisect
        self._has_base = False  # the first record is a reset's marker, not an entry
        self._dirty: list[_Segment] = []  # written since the last sync
        self._dir_dirty = False  # a segment was created since the last sync
        self._failed: OSError | None = None  # a sync that failed: this log is done
        make_dir(directory)
        self._open()

    # ---- opening ---------------------------------------------------------------------------

    def _open(self) -> None:
        names = sorted(p.name for p in self.directory.iterdir() if _NAME.match(p.name))
        for n, name in enumerate(names):
            seg = _Segment(int(name[:20]), self.directory / name)
            self._load(seg, last=n == len(names) - 1)
            prev = self._segments[-1] if self._segments else None
            if prev is not None and seg.first != prev.last() + 1:
                raise CorruptLog(_advice(seg.path, 0, prev.last() + 1,
                                         f"a segment starting at {seg.first} after one "
                                         f"ending at {prev.last()}"))
            if not seg.offsets:
                if n != len(names) - 1:
                    raise CorruptLog(_advice(seg.path, 0, seg.first, "an empty segment"))
                # Created by a roll or emptied by a truncation just before a crash: nothing.
                seg.path.unlink()
                fsync_dir(self.directory)
                continue
            self._segments.append(seg)
        self._firsts = [s.first for s in self._segments]

    def _load(self, seg: _Segment, *, last: bool) -> None:
        buf = seg.path.read_bytes()
        expect = seg.first
        try:
            for offset, index, term, kind, _ in records(buf):
                if index != expect:
                    raise CorruptLog(_advice(seg.path, offset, expect,
                                             f"entry {index} out of place"))
                if kind not in _KINDS and kind != BASE_KIND:  # written by a newer version?
                    raise CorruptLog(_advice(seg.path, offset, index,
                                             f"an unknown entry kind {kind}"))
                if kind == BASE_KIND:
                    if self._segments or offset != 0:
                        raise CorruptLog(_advice(seg.path, offset, index,
                                                 "a reset marker inside the log"))
                    self._has_base = True
                seg.offsets.append(offset)
                seg.terms.append(term)
                expect += 1
            seg.size = seg.allocated = len(buf)
        except BadRecord as bad:
            if last and bad.length == 0 and buf.count(0, bad.offset) == len(buf) - bad.offset:
                seg.size, seg.allocated = bad.offset, len(buf)  # the rest was allocated ahead
                return
            if not (last and is_torn(buf, bad)):
                raise CorruptLog(_advice(seg.path, bad.offset, expect, bad.reason)) from None
            # A write cut short by a crash, never synced, so never acknowledged: cut it off.
            log.warning("%s: cutting a torn last record at offset %d (%s)",
                        seg.path, bad.offset, bad.reason)
            fd = os.open(seg.path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, bad.offset)
                os.fsync(fd)
            finally:
                os.close(fd)
            seg.size = seg.allocated = bad.offset

    # ---- reading ---------------------------------------------------------------------------

    def first_index(self) -> int:
        """The first entry held; ``last_index() + 1`` when the log holds none."""
        if not self._segments:
            return 1
        return self._segments[0].first + (1 if self._has_base else 0)

    def last_index(self) -> int:
        return self._segments[-1].last() if self._segments else 0

    def _locate(self, index: int) -> tuple[_Segment, int] | None:
        k = bisect.bisect_right(self._firsts, index) - 1
        if k < 0:
            return None
        seg = self._segments[k]
        return (seg, index - seg.first) if index <= seg.last() else None

    def term(self, index: int) -> int | None:
        """The term of entry ``index`` (or of a reset's base); None if the log lacks it."""
        if index == 0:
            return 0
        found = self._locate(index)
        return None if found is None else found[0].terms[found[1]]

    def entries(self, after: int = 0) -> list[Entry]:
        """Every entry past ``after`` (the snapshot's index when a replica restarts)."""
        out: list[Entry] = []
        for seg in self._segments:
            if seg.last() <= after:
                continue
            start = max(0, after + 1 - seg.first)
            offset = seg.offsets[start]
            with open(seg.path, "rb") as f:
                f.seek(offset)
                buf = f.read(seg.size - offset)
            try:
                for _, index, term, kind, data in records(buf, offset):
                    if kind != BASE_KIND:
                        out.append(Entry(index, term, data, _KINDS[kind]))
            except BadRecord as bad:  # it checked out on open: something changed the file since
                raise CorruptLog(_advice(seg.path, bad.offset, -1, bad.reason)) from None
        return out

    def segment_paths(self) -> list[Path]:
        return [s.path for s in self._segments]

    def end(self) -> tuple[Path, int] | None:
        """The last segment and where its data ends (the file may be longer: preallocated)."""
        return (self._segments[-1].path, self._segments[-1].size) if self._segments else None

    # ---- writing ---------------------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        """Write ``entries`` (consecutive) after the log's end; if the first is already held,
        the log is first truncated there (the core asks for that only at a conflict). Not
        durable until ``sync``."""
        self._check()
        if not entries:
            return
        start = entries[0].index
        for i, e in enumerate(entries):
            if e.index != start + i:
                raise ValueError(f"entries to append are not consecutive at {e.index}")
        if start <= self.last_index():
            self._truncate(start)
        elif start != self.last_index() + 1:
            raise ValueError(f"entry {start} does not follow the log's end {self.last_index()}")
        seg = self._segments[-1] if self._segments else self._create(start)
        buf = bytearray()
        for e in entries:
            if seg.size + len(buf) >= self.segment_bytes and (seg.offsets or buf):
                self._write(seg, buf)
                buf = bytearray()
                # The full segment is trimmed to its data (zeros before the next segment
                # would read as damage) and made durable before the next one holds anything,
                # so a crash can tear only the last segment.
                os.ftruncate(self._fd(seg), seg.size)
                seg.allocated = seg.size
                self._durably(os.fdatasync, self._fd(seg))
                if seg in self._dirty:
                    self._dirty.remove(seg)
                seg.close()
                seg = self._create(e.index)
            seg.offsets.append(seg.size + len(buf))
            seg.terms.append(e.term)
            buf += encode_record(e.index, e.term, int(e.kind), e.data)
        self._write(seg, buf)

    def _fd(self, seg: _Segment) -> int:
        if seg.fd is None:
            # Not O_APPEND: Linux's pwrite would append past the preallocated space.
            seg.fd = os.open(seg.path, os.O_WRONLY | os.O_CLOEXEC)
        return seg.fd

    def _write(self, seg: _Segment, buf: bytearray) -> None:
        if buf:
            fd = self._fd(seg)
            self._allocate(seg, fd, seg.size + len(buf))
            try:
                pwrite_all(fd, buf, seg.size)
            except OSError:
                # A full disk, say: take back the part written (the file ends there), or
                # the next append would follow a torn record that reads as damage.
                os.ftruncate(fd, seg.size)
                seg.allocated = seg.size
                keep = bisect.bisect_left(seg.offsets, seg.size)  # the records of ``buf`` on
                del seg.offsets[keep:]
                del seg.terms[keep:]
                raise
            seg.size += len(buf)
            if seg not in self._dirty:
                self._dirty.append(seg)

    def _create(self, first: int) -> _Segment:
        seg = _Segment(first, self.directory / f"{first:020d}.log")
        seg.fd = os.open(seg.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self._segments.append(seg)
        self._firsts.append(first)
        self._dir_dirty = True
        return seg

    def _allocate(self, seg: _Segment, fd: int, end: int) -> None:
        """Allocate the file up to ``end`` and a chunk beyond (it reads as zeros). Where the
        file system cannot, the writes simply grow the file."""
        if end > seg.allocated:
            target = end + min(PREALLOCATE_BYTES, self.segment_bytes)
            try:
                os.posix_fallocate(fd, seg.size, target - seg.size)
            except OSError:
                return
            seg.allocated = target

    def sync(self) -> None:
        """Make every append so far durable: the data of each segment written, then the
        directory if a segment was created."""
        self._check()
        for seg in self._dirty:
            self._durably(os.fdatasync, self._fd(seg))
            if seg is not self._segments[-1]:
                seg.close()
        self._dirty.clear()
        if self._dir_dirty:
            self._durably(fsync_dir, self.directory)
            self._dir_dirty = False

    def _durably(self, sync: Callable[[T], None], target: T) -> None:
        """A failed sync is final: the kernel may have dropped the pages it could not write
        and marked them clean, so a retry could report success for data that is gone
        (Postgres's "fsyncgate"). Every later write or sync raises; the replica must stop
        and reopen the log."""
        try:
            sync(target)
        except OSError as exc:
            self._failed = exc
            raise

    def _check(self) -> None:
        if self._failed is not None:
            raise OSError(f"{self.directory}: an earlier sync failed ({self._failed}); "
                          f"restart the replica") from self._failed

    def _drop(self, seg: _Segment) -> None:
        """Unlink one whole segment, durably before the next step (a later segment gone
        while an earlier one survives would leave a gap that reads as damage)."""
        seg.close()
        if seg in self._dirty:
            self._dirty.remove(seg)
        seg.path.unlink()
        self._durably(fsync_dir, self.directory)

    def _truncate(self, index: int) -> None:
        if index < self.first_index():
            raise ValueError(f"cannot truncate at {index}: the log starts at "
                             f"{self.first_index()}")
        k = bisect.bisect_right(self._firsts, index) - 1
        # Newest first: a crash part way leaves a shorter log, never one with a gap.
        while len(self._segments) > k + 1:
            self._drop(self._segments.pop())
            self._firsts.pop()
        seg = self._segments[k]
        i = index - seg.first
        offset = seg.offsets[i]
        fd = self._fd(seg)
        os.ftruncate(fd, offset)
        self._durably(os.fsync, fd)  # durable before new entries land where the old ones were
        del seg.offsets[i:]
        del seg.terms[i:]
        seg.size = seg.allocated = offset

    def compact(self, index: int) -> None:
        """Drop the segments whose entries are all ``<= index``, oldest first; never the
        active one, and never a file rewritten. The first kept segment may still hold entries
        up to ``index``: readers skip them (``entries(after=...)``)."""
        self._check()
        while len(self._segments) > 1 and self._segments[0].last() <= index:
            self._drop(self._segments.pop(0))
            self._firsts.pop(0)
            self._has_base = False

    def reset(self, index: int, term: int) -> None:
        """Drop the whole log (a snapshot from the leader replaces it): the log continues
        after ``(index, term)``, which a marker record remembers so that ``term(index)``
        still answers, and a restart can tell this log from the one the install replaced."""
        self._check()
        while self._segments:
            self._drop(self._segments.pop())
        self._firsts.clear()
        seg = self._create(index)
        seg.offsets.append(0)
        seg.terms.append(term)
        self._write(seg, bytearray(encode_record(index, term, BASE_KIND, b"")))
        self._has_base = True
        self.sync()

    def close(self) -> None:
        for seg in self._segments:
            seg.close()
        self._dirty.clear()
