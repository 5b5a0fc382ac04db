"""Crash-safe replacement of a replica's state: the state directory (RocksDB) behind a pointer
file, and the snapshot files a replica keeps.

``StateDir``: the live state is the directory ``CURRENT`` names. A new state (a snapshot
received from the leader) is built in a staging directory, fsynced whole, renamed beside the
live one, and only then does ``CURRENT`` switch to it (temp file, fsync, rename, directory
fsync); the old directory goes last. A crash at any step leaves the old state or the new one
current and whole, and the next open removes whatever is left of the other. (pysyncobj's
install deleted the live RocksDB directory, then renamed the new one in: a crash between
left a replica that could not open, finding 7.)

``SnapshotStore``: each snapshot is one file, its ``SnapshotMeta`` in a checksummed msgpack
header and the data after it, written to a temp file, fsynced and renamed in: a snapshot file
is there whole or not at all.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import msgpack

from sqsq.raft import ConfState, SnapshotMeta
from sqsq.shard.durable import (
    TMP_SUFFIX,
    atomic_write,
    fsync_dir,
    fsync_tree,
    make_dir,
    remove_tree,
)

POINTER = "CURRENT"
_STATE = re.compile(r"^state-(\d{8})$")
_STAGE = re.compile(r"^stage-(\d{8})$")


class StateDirError(Exception):
    """The state directory cannot be opened as it is: an operator must look."""


class StateDir:
    def __init__(self, root: Path) -> None:
        self.root = root
        make_dir(root)
        self._current = self._read_pointer()
        self._clean()

    def _generations(self) -> list[int]:
        return [int(m.group(1)) for p in self.root.iterdir()
                if (m := _STATE.match(p.name) or _STAGE.match(p.name))]

    def _read_pointer(self) -> Path:
        pointer = self.root / POINTER
        try:
            name = pointer.read_text().strip()
        except FileNotFoundError:
            states = [p for p in self.root.iterdir() if _STATE.match(p.name)]
            if any(any(p.iterdir()) for p in states):
                # Cleaning up now would delete the only copy of the state. (Empty ones are
                # a first start that a crash cut before the pointer was written.)
                raise StateDirError(
                    f"{self.root}: state directories but no {POINTER} naming the live one; "
                    f"restore {POINTER} (it holds the directory's name) or the replica's "
                    f"data directory from a backup") from None
            first = self.root / "state-00000001"  # a new replica: an empty state
            first.mkdir(exist_ok=True)
            fsync_dir(self.root)
            atomic_write(pointer, first.name.encode() + b"\n")
            return first
        if not _STATE.match(name) or not (self.root / name).is_dir():
            raise StateDirError(
                f"{pointer} names {name!r}, which is not a state directory here; restore the "
                f"replica's data directory from a backup or replace the replica")
        return self.root / name

    def _clean(self) -> None:
        """Leftovers of a crash: staging directories, states no longer current, the
        pointer's temp file. None of them holds anything the replica depends on."""
        removed = False
        for p in self.root.iterdir():
            stale_state = _STATE.match(p.name) and p != self._current
            if stale_state or _STAGE.match(p.name) or p.name == POINTER + TMP_SUFFIX:
                remove_tree(p)
                removed = True
        if removed:
            fsync_dir(self.root)

    def current(self) -> Path:
        return self._current

    def stage(self) -> Path:
        """A fresh, empty directory to build the next state in."""
        path = self.root / f"stage-{max(self._generations(), default=0) + 1:08d}"
        path.mkdir()
        return path

    def commit(self, staged: Path) -> Path:
        """Make ``staged`` the live state; returns its new path. The caller has closed what
        it held open in the old state (RocksDB): that directory is removed last."""
        m = _STAGE.match(staged.name)
        if m is None or staged.parent != self.root:
            raise ValueError(f"{staged} is not a staging directory of {self.root}")
        fsync_tree(staged)  # the new state is durable before anything points at it
        final = self.root / f"state-{m.group(1)}"
        os.rename(staged, final)
        fsync_dir(self.root)
        atomic_write(self.root / POINTER, final.name.encode() + b"\n")  # the switch
        old, self._current = self._current, final
        remove_tree(old)  # only now: until the switch was durable, it was the live state
        fsync_dir(self.root)
        return final


# ---- snapshot files -------------------------------------------------------------------------

SNAPSHOT_MAGIC = b"SQSQRSN1"
_HEADER = struct.Struct("<II")  # header length, crc32 of the header
_SNAP = re.compile(r"^(\d{20})-(\d{20})\.snap$")


class SnapshotError(Exception):
    """A snapshot file that was renamed in whole reads back damaged."""


def encode_meta(meta: SnapshotMeta) -> bytes:
    header = msgpack.packb([meta.index, meta.term, sorted(meta.conf.voters),
                            sorted(meta.conf.learners)], use_bin_type=True)
    return SNAPSHOT_MAGIC + _HEADER.pack(len(header), zlib.crc32(header)) + header


def read_meta(f: BinaryIO, path: Path) -> SnapshotMeta:
    """The metadata at the start of a snapshot file; ``f`` is left at the data."""
    try:
        if f.read(len(SNAPSHOT_MAGIC)) != SNAPSHOT_MAGIC:
            raise ValueError("not a sqsq Raft snapshot")
        length, crc = _HEADER.unpack(f.read(_HEADER.size))
        header = f.read(length)
        if len(header) != length or zlib.crc32(header) != crc:
            raise ValueError("bad header checksum")
        index, term, voters, learners = msgpack.unpackb(header, raw=False)
        return SnapshotMeta(index, term, ConfState(frozenset(voters), frozenset(learners)))
    except Exception as exc:  # any way the bytes fail to parse is the same damage
        raise SnapshotError(f"{path}: damaged snapshot header ({exc}); restore the replica's "
                            f"data directory from a backup or replace the replica") from exc


class SnapshotStore:
    def __init__(self, directory: Path, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError("a replica keeps at least its newest snapshot")
        self.directory = directory
        self.keep = keep
        make_dir(directory)
        leftovers = [p for p in directory.iterdir() if p.name.endswith(TMP_SUFFIX)]
        for p in leftovers:  # a save a crash cut short: never renamed in, never relied on
            p.unlink()
        if leftovers:
            fsync_dir(directory)

    def _files(self) -> list[Path]:
        return sorted(p for p in self.directory.iterdir() if _SNAP.match(p.name))

    def save(self, meta: SnapshotMeta, write: Callable[[BinaryIO], object]) -> Path:
        """Store a snapshot: its metadata, then whatever ``write`` puts in the file. Durable
        and whole when this returns; older snapshots beyond ``keep`` are then removed."""
        path = self.directory / f"{meta.index:020d}-{meta.term:020d}.snap"
        tmp = path.with_name(path.name + TMP_SUFFIX)
        try:
            with open(tmp, "wb") as f:
                f.write(encode_meta(meta))
                write(f)
                f.flush()
                os.fsync(f.fileno())  # the data is on disk before the name says it is there
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, path)
        fsync_dir(self.directory)
        # Older snapshots go only now that the new one is durable.
        stale = self._files()[: -self.keep]  # sorted by (index, term): the newest last
        for p in stale:
            p.unlink()
        if stale:
            fsync_dir(self.directory)
        return path

    def latest(self) -> tuple[SnapshotMeta, Path] | None:
        files = self._files()
        if not files:
            return None
        path = files[-1]
        with open(path, "rb") as f:
            meta = read_meta(f, path)
        m = _SNAP.match(path.name)
        assert m is not None
        if (meta.index, meta.term) != (int(m.group(1)), int(m.group(2))):
            raise SnapshotError(f"{path}: its header says index {meta.index} term "
                                f"{meta.term}; restore or replace the replica")
        return meta, path

    def open_data(self, path: Path) -> BinaryIO:
        """The snapshot file, positioned at its data (after the metadata)."""
        f = open(path, "rb")  # the caller closes it
        try:
            read_meta(f, path)
        except BaseException:
            f.close()
            raise
        return f
