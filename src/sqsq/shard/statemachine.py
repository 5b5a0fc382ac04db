"""One replica's state machine: committed log entries applied to the shard's store, and
snapshots of that store for Raft's log compaction and catch-up.

Every replica applies the same entries in log order, through ``core.apply`` or by writing
what that wrote on the leader (``apply_writes``, ``sqsq.shard.writesets``), and writes the
entry's Raft index in the same atomic batch (``Meta.applied_index``), so an entry replayed
after a restart (the Raft log is replayed from the store's applied index) is skipped, never
applied twice. The writes are not fsynced: the Raft log and the snapshot files are what is
durable, and a restart replays whatever the store lost (from the newest snapshot, if the
store fell behind it).

A command whose apply raises (a bug some input reaches) is answered InternalError and
changes nothing, on every replica alike: the core is deterministic, so the same command
raises the same way over the same state everywhere, and the entry's other commands apply as
if it were not there. Only a failure that may differ between replicas stops the replica with
a ``PoisonEntry`` naming the shard, the index and the command: the store failing under a read
(a frame of ``shard/store.py`` in the traceback), memory, recursion depth or the OS
(docs/operations.md says how to recover). This replaced a dry run of every command on the
leader before proposing it, which cost a quarter of a leader's CPU per message.

A snapshot is a file: a header (the store's applied index) and a
tar of a store checkpoint (for RocksDB hard-linked SSTs, so taking one is cheap; the copy into
the tar is not). A replica adopts a snapshot only if it is ahead of its own store.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import tarfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgpack

from sqsq.core import commands as c
from sqsq.core import keys, records
from sqsq.core.entry import decode_entry
from sqsq.core.machine import apply, apply_commands
from sqsq.core.state import ShardConfig
from sqsq.core.txn import Txn
from sqsq.errors import ErrorCode, Rejection
from sqsq.shard import store as store_module
from sqsq.shard.currentstore import CurrentStore, Installing, open_store
from sqsq.shard.durable import fsync_path

log = logging.getLogger("sqsq.shard")

SNAPSHOT_MAGIC = b"SQSQSNP1"
_HEADER_LEN = struct.Struct(">I")


class ConfigurationMismatch(RuntimeError):
    pass


class PoisonEntry(RuntimeError):
    """A committed entry whose apply raised: every replica stops at it."""


def describe(command: c.Command) -> str:
    """A command as an operator looks for it: its kind and the queue it names."""
    kind = type(command).__name__
    queue = getattr(command, "queue", None) or getattr(command, "name", None) or \
        getattr(command, "source_arn", None)
    return f"{kind} on queue {queue!r}" if queue else kind


_STORE_CODE = os.path.normcase(os.path.abspath(store_module.__file__))
# RocksStore.get is rocksdict's own (C): a read it fails has no frame in store.py, only
# its caller's, this one.
_STORE_READS = frozenset({CurrentStore.get.__code__})
_ENVIRONMENTAL = (MemoryError, RecursionError, OSError)


def contained(exc: BaseException) -> bool:
    """Whether every replica applying the same entry over the same state raises ``exc``
    too, so answering InternalError keeps them identical: true of the pure core's own
    failures, not of the store's (a disk or RocksDB error on this replica only: a frame
    of ``shard/store.py`` or of ``CurrentStore.get`` in the traceback) nor of memory,
    recursion depth or the OS."""
    if isinstance(exc, (_ENVIRONMENTAL, Installing)):
        return False
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code in _STORE_READS or \
                os.path.normcase(os.path.abspath(code.co_filename)) == _STORE_CODE:
            return False
        tb = tb.tb_next
    return True


class ShardMachine:
    """What a ``RaftReplica`` applies committed entries to (in a worker thread)."""

    def __init__(self, directory: Path, config: ShardConfig, *, memory: bool = False) -> None:
        self.directory = directory
        self.config = config
        self.memory = memory
        directory.mkdir(parents=True, exist_ok=True)
        self.store = CurrentStore(open_store(self._db_path, memory))
        self.check_configuration()
        self._read_progress()
        self._lock = threading.Lock()  # snapshots against a concurrent admin checkpoint

    @property
    def _db_path(self) -> Path:
        return self.directory / ("db.mem" if self.memory else "db")

    def meta(self) -> records.Meta:
        return records.Meta.decode(self.store.get(keys.META_KEY))

    def _read_progress(self) -> None:
        """The applied index and time, kept here so the leader stamps entries without a read."""
        meta = self.meta()
        self.applied_index, self.last_now_ms = meta.applied_index, meta.last_now_ms

    def recorded_fingerprint(self) -> str | None:
        raw = self.store.get(keys.CONFIG_KEY)
        return None if raw is None else raw.decode()

    def check_configuration(self) -> None:
        """A replica whose cluster configuration differs from the recorded one refuses to run:
        its handles and ARNs would differ from its peers'."""
        recorded = self.recorded_fingerprint()
        if recorded is not None and recorded != self.config.fingerprint():
            raise ConfigurationMismatch(
                f"{self.directory}: this replica's cluster configuration (secret, region, "
                f"account) differs from the one recorded in the shard's state")

    def apply_entry(self, index: int, data: bytes) -> list[c.Outcome] | None:
        applied = self.apply_entry_writes(index, data)
        return None if applied is None else applied[0]

    def apply_entry_writes(self, index: int, data: bytes
                           ) -> tuple[list[c.Outcome], Mapping[bytes, bytes | None]] | None:
        """``apply_entry``, and what it wrote (the write set a leader shares); None for an
        entry already applied."""
        if index <= self.applied_index:
            return None  # replayed after a restart: already in the store
        entry = decode_entry(data)
        txn = Txn(self.store)
        try:  # the common case: every command applies, in one transaction, no undo log
            outcomes = apply_commands(txn, self.config, entry.commands, entry.now_ms)
        except Exception as exc:  # noqa: BLE001 - sorted out below
            self._fatal_unless_deterministic(index, entry.commands, exc)
            txn = Txn(self.store)
            outcomes = self._apply_each(txn, index, entry.commands, entry.now_ms)
        writes, last_now_ms = _sealed(txn, index, entry.now_ms)
        self.store.write(writes, sync=False)
        self.applied_index, self.last_now_ms = index, last_now_ms
        if any(isinstance(command, c.Configure) for command in entry.commands):
            self.check_configuration()  # a mismatch stops this replica, never diverges it
        return outcomes, writes

    def prepare(self, index: int, data: bytes) -> Prepared | None:
        """Entry ``index`` applied to a transaction over the store, nothing written: what
        ``apply_entry_writes`` will give once it is committed, worked out while a leader
        waits for its followers (``apply_prepared``). Only for the entry right after the
        applied one, since the store is then the committed state it applies to. None where
        it cannot be worked out ahead: the entry applies as usual when committed."""
        if index != self.applied_index + 1:
            return None
        entry = decode_entry(data)
        if any(isinstance(command, c.Configure) for command in entry.commands):
            return None
        txn = Txn(self.store)
        try:
            outcomes = apply_commands(txn, self.config, entry.commands, entry.now_ms)
        except Exception:  # noqa: BLE001 - the apply at commit sorts it out
            return None
        writes, last_now_ms = _sealed(txn, index, entry.now_ms)
        return Prepared(index, data, outcomes, writes, last_now_ms)

    def apply_prepared(self, prepared: Prepared
                       ) -> tuple[list[c.Outcome], Mapping[bytes, bytes | None]]:
        """A prepared entry applied by writing what preparing it wrote (as
        ``apply_entry_writes``). The caller has checked that the committed entry is the one
        prepared; the store must still be where it was when it was prepared."""
        if prepared.index != self.applied_index + 1:
            raise ValueError(f"entry {prepared.index} was prepared over applied index "
                             f"{prepared.index - 1}, and the store is at {self.applied_index}")
        self.store.write(prepared.writes, sync=False)
        self.applied_index, self.last_now_ms = prepared.index, prepared.last_now_ms
        return prepared.outcomes, prepared.writes

    def apply_writes(self, index: int, writes: Mapping[bytes, bytes | None]) -> None:
        """Entry ``index`` applied by writing what applying it wrote on another replica (a
        leader's shared write set, ``sqsq.shard.writesets``, checked to be that entry's):
        the same store as ``apply_entry`` would leave, without running the commands."""
        if index <= self.applied_index:
            return
        meta = records.Meta.decode(writes[keys.META_KEY])
        self.store.write(writes, sync=False)
        self.applied_index, self.last_now_ms = index, meta.last_now_ms
        if keys.CONFIG_KEY in writes:
            self.check_configuration()

    def _apply_each(self, txn: Txn, index: int, commands: tuple[c.Command, ...],
                    now_ms: int) -> list[c.Outcome]:
        """The entry again, each command behind a savepoint: one that raises is rolled back
        and answered InternalError; the others apply as they would without it."""
        outcomes = []
        for command in commands:
            savepoint = txn.savepoint()
            try:
                outcomes.append(apply(txn, self.config, command, now_ms))
            except Exception as exc:  # noqa: BLE001 - the point is to contain it
                self._fatal_unless_deterministic(index, (command,), exc)
                txn.rollback(savepoint)
                log.error("shard %d: log entry %d: %s raised %r on apply; it changed nothing "
                          "and was answered InternalError", self.config.shard_id, index,
                          describe(command), exc)
                outcomes.append(c.Outcome(Rejection(ErrorCode.INTERNAL_ERROR,
                                                    "The server could not apply the request.")))
        return outcomes

    def _fatal_unless_deterministic(self, index: int, commands: tuple[c.Command, ...],
                                    exc: Exception) -> None:
        """Stop the replica (``PoisonEntry``) on a failure another replica may not share."""
        if contained(exc):
            return
        raise PoisonEntry(
            f"shard {self.config.shard_id}: log entry {index} "
            f"({', '.join(sorted({describe(command) for command in commands}))}) failed to "
            f"apply: {exc!r}. This replica stops at this entry; if every replica does, "
            f"restore the shard from a backup taken before it (docs/operations.md)") from exc

    # ---- snapshots ----
    def write_snapshot(self, path: str, raft_data: bytes) -> Callable[[], None]:
        """Take the checkpoint now (the state as of the last applied entry); return what packs
        it into ``path`` and fsyncs it, which the caller runs in a worker thread."""
        with self._lock:
            staging = Path(path + ".ckpt")
            _remove(staging)
            self.store.checkpoint(str(staging))
            header = msgpack.packb({"applied_index": self.applied_index, "raft": raft_data,
                                    "memory": self.memory}, use_bin_type=True)

        def write_file() -> None:
            with open(path, "wb") as f:
                f.write(SNAPSHOT_MAGIC + _HEADER_LEN.pack(len(header)) + header)
                with tarfile.open(fileobj=f, mode="w|") as tar:
                    tar.add(str(staging), arcname="db")
                f.flush()
                os.fsync(f.fileno())
            _remove(staging)

        return write_file

    def read_snapshot(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return self.install_from(f)

    def install_from(self, f: BinaryIO) -> bytes:
        """Adopt the snapshot ``write_snapshot`` wrote, read from ``f``, if it is ahead of
        this store; its ``raft_data`` either way."""
        if f.read(len(SNAPSHOT_MAGIC)) != SNAPSHOT_MAGIC:
            raise ValueError(f"{getattr(f, 'name', 'snapshot')}: not a sqsq snapshot")
        (n,) = _HEADER_LEN.unpack(f.read(_HEADER_LEN.size))
        header = msgpack.unpackb(f.read(n), raw=False)
        if header["applied_index"] > self.applied_index:
            self._install(f, header["applied_index"])
        return header["raft"]

    def _install(self, f: object, index: int) -> None:
        """Replace the store with the snapshot's (it is ahead of ours)."""
        with self._lock:
            fresh = self.directory / "db.install"
            _remove(fresh)
            fresh.mkdir()
            with tarfile.open(fileobj=f, mode="r|") as tar:  # type: ignore[arg-type]
                tar.extractall(fresh, filter="data")
            _fsync_tree(fresh)
            with self.store.swapping():  # reads wait for nothing closed, or are refused
                self.store.inner.close()
                _remove(self._db_path)
                os.replace(fresh / "db", self._db_path)
                fsync_path(self.directory, directory=True)
                self.store.inner = open_store(self._db_path, self.memory)
                self._read_progress()
            _remove(fresh)
            log.info("installed a snapshot at index %d (%s)", index, self.directory)

    def checkpoint(self, path: str) -> None:
        """An export checkpoint (admin), consistent with what has been applied."""
        with self._lock:
            self.store.checkpoint(path)

    def close(self) -> None:
        self.store.close()


@dataclass(frozen=True, slots=True)
class Prepared:
    """An entry's apply worked out before its commit (``ShardMachine.prepare``)."""

    index: int
    data: bytes  # the entry prepared: only the very same entry may use it
    outcomes: list[c.Outcome]
    writes: Mapping[bytes, bytes | None]
    last_now_ms: int


def _sealed(txn: Txn, index: int, now_ms: int) -> tuple[dict[bytes, bytes | None], int]:
    """An entry's writes with the store's meta (applied index, last time) moved to it."""
    raw = txn.get(keys.META_KEY)
    held = txn.memo.get(keys.META_KEY)  # the meta the last command wrote, if any
    meta = held[1] if held is not None and held[0] is raw else records.Meta.decode(raw)
    meta.applied_index = index
    meta.last_now_ms = max(meta.last_now_ms, now_ms)
    txn.put(keys.META_KEY, meta.encode())
    return txn.writes(), meta.last_now_ms


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fsync_path(os.path.join(dirpath, name))
        fsync_path(dirpath, directory=True)
