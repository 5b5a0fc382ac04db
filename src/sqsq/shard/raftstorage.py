"""One replica's Raft storage, as the host uses it: load on start, persist each ``Ready``,
store snapshots, compact.

Layout under the replica's directory::

    log/         SegmentedLog: 00000000000000000001.log, ...
    hardstate    term, vote, commit (replaced whole)
    snapshots/   SnapshotStore: <index>-<term>.snap, the newest ``keep``

The order of writes is what makes a crash safe:

- ``persist``: entries appended and synced, then the hard state replaced. A hard state
  whose commit points past the durable log would leave a replica that refuses to open, and
  nothing may be sent before both are durable (the core's ``Ready`` contract).
- ``install_snapshot`` (a snapshot from the leader): the snapshot file is durable before the
  log it replaces is reset. A crash in between leaves the new snapshot and the old log; the
  next ``load`` sees that the log does not continue the snapshot (its term at the snapshot's
  index differs, or it does not reach it) and finishes the reset. The state machine is
  swapped separately (``StateDir``); a host whose state is behind the newest snapshot after a
  restart restores it from that snapshot's file.
- ``compact`` keeps the entry at the newest snapshot's index, so that check always has the
  term it needs.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from sqsq.raft import Entry, HardState, SnapshotMeta
from sqsq.shard.durable import make_dir
from sqsq.shard.hardstate import read_hard_state, write_hard_state
from sqsq.shard.raftlog import SEGMENT_BYTES, SegmentedLog
from sqsq.shard.statedir import SnapshotStore

log = logging.getLogger("sqsq.shard")


class StorageError(Exception):
    """The replica's storage is inconsistent in a way no crash explains."""


class RaftStorage:
    def __init__(self, directory: Path, *, segment_bytes: int = SEGMENT_BYTES,
                 keep_snapshots: int = 2, durable: bool = True) -> None:
        self.directory = directory
        self.durable = durable  # off: no fsync per Ready (benchmarks only; loses writes)
        make_dir(directory)
        self.log = SegmentedLog(directory / "log", segment_bytes)
        self.snapshots = SnapshotStore(directory / "snapshots", keep_snapshots)
        self.hard_state_path = directory / "hardstate"
        self._hard_state = HardState()  # as the file holds it
        self._snapshot: SnapshotMeta | None = None

    def load(self) -> tuple[HardState, SnapshotMeta | None, tuple[Entry, ...]]:
        """What the replica restarts with: its hard state, its newest snapshot (None for a
        group's first start) and the log's entries after that snapshot."""
        hs = read_hard_state(self.hard_state_path)
        latest = self.snapshots.latest()
        meta = latest[0] if latest is not None else None
        snap_index, snap_term = (meta.index, meta.term) if meta is not None else (0, 0)
        first, last = self.log.first_index(), self.log.last_index()
        if last >= first and first > snap_index + 1:
            raise StorageError(
                f"{self.directory}: the log starts at {first} but the newest snapshot ends at "
                f"{snap_index}: entries {snap_index + 1}..{first - 1} are nowhere. Restore "
                f"the replica's directory from a backup or replace the replica")
        term = self.log.term(snap_index)
        continues = term == snap_term or (term is None and last >= first == snap_index + 1)
        if not continues:
            # A snapshot from the leader was saved and a crash came before the log it
            # replaces was reset (or the log stops short of it): finish the install.
            log.warning("%s: the log does not continue the snapshot at %d (term %d); "
                        "resetting it", self.directory, snap_index, snap_term)
            self.log.reset(snap_index, snap_term)
        entries = tuple(self.log.entries(after=snap_index))
        end = entries[-1].index if entries else snap_index
        if hs.commit > end:
            raise StorageError(
                f"{self.directory}: the hard state's commit {hs.commit} is past the log's end "
                f"{end}: committed entries are missing. Restore the replica's directory from "
                f"a backup or replace the replica")
        self._hard_state, self._snapshot = hs, meta
        return hs, meta, entries

    def persist(self, entries: Sequence[Entry], hard_state: HardState | None) -> None:
        """A ``Ready``'s entries, and its term and vote, durable when this returns.

        The hard state file is replaced only when the term or the vote changed: those must
        never be forgotten (a node that forgets its vote may vote twice in a term). The
        commit index rides along but need not be durable: a replica restarting with an older
        one applies nothing it has not applied, and learns the rest from the leader.
        Replacing the file for every new commit tripled the cost of a Ready."""
        if entries:
            self.log.append(entries)
        if self.durable:
            self.log.sync()
        if hard_state is not None and (hard_state.term, hard_state.vote) != (
                self._hard_state.term, self._hard_state.vote):
            write_hard_state(self.hard_state_path, hard_state)
            self._hard_state = hard_state

    def save_snapshot(self, meta: SnapshotMeta, write: Callable[[BinaryIO], object]) -> Path:
        """A snapshot this replica took of its own state; the log is untouched (``compact``
        drops what it covers, when the host chooses)."""
        path = self.snapshots.save(meta, write)
        self._snapshot = meta
        return path

    def install_snapshot(self, meta: SnapshotMeta, write: Callable[[BinaryIO], object]) -> Path:
        """A snapshot from the leader: it replaces the whole log (the core's ``restore``)."""
        path = self.snapshots.save(meta, write)  # durable before the log goes
        self._snapshot = meta
        self.log.reset(meta.index, meta.term)
        return path

    def latest_snapshot(self) -> tuple[SnapshotMeta, Path] | None:
        return self.snapshots.latest()

    def compact(self, index: int) -> None:
        """Drop the log's whole segments up to ``index``, but never the newest snapshot's own
        entry (see the module doc)."""
        if self._snapshot is None:
            return  # nothing else holds these entries
        self.log.compact(min(index, self._snapshot.index - 1))

    def close(self) -> None:
        self.log.close()


_Write = tuple[Callable[[], Any], "asyncio.Future[Any]"]
# The writer thread ends after this long without a batch (a new one starts with the next).
WRITER_IDLE_S = 1.0


class Writes:
    """A node's Raft writes, every replica's, batched into calls to one writer thread: the
    writes asked for during one event-loop turn, and those asked for while a call runs, go
    in one call. A hand-off to another thread (two wake-ups across threads, the GIL handed
    back and forth) costs about as much CPU as an fsync; a node with several busy shards
    pays it once per batch rather than once per replica, and the replicas whose writes are
    done resume in one loop turn, so what they send leaves in one frame per peer. A batch's
    writes run one after another; one replica's stay in order (it asks for the next once
    the last is done). The thread is the node's own, fed through a queue, not the loop's
    executor: ``run_in_executor`` and its two chained futures cost 55 against 22 us of CPU
    a round trip here. Everything but the writer's part runs on the event loop."""

    def __init__(self) -> None:
        self._queue: list[_Write] = []
        self._busy = False
        self._jobs: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, list[_Write]]] = \
            queue.SimpleQueue()
        self._lock = threading.Lock()  # the writer's start and end against new batches
        self._writer: threading.Thread | None = None
        self.batches = self.writes = 0  # counters: writer calls, writes done in them

    def run(self, write: Callable[[], Any]) -> asyncio.Future[Any]:
        """Do ``write`` in the writer thread with the others of its batch; its outcome."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._queue.append((write, done))
        if not self._busy:
            self._busy = True
            loop.call_soon(self._start)  # the rest of this turn's writes join the batch
        return done

    def _start(self) -> None:
        batch, self._queue = self._queue, []
        self.batches += 1
        self.writes += len(batch)
        with self._lock:
            self._jobs.put((asyncio.get_running_loop(), batch))
            if self._writer is None:
                self._writer = threading.Thread(target=self._work, name="raft-writes",
                                                daemon=True)
                self._writer.start()

    def _work(self) -> None:
        """The writer thread: each batch's writes, then their outcomes to the loop."""
        while True:
            try:
                loop, batch = self._jobs.get(timeout=WRITER_IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._writer = None
                        return
                continue
            outcomes = _run_all([write for write, _ in batch])
            try:
                loop.call_soon_threadsafe(self._settle, batch, outcomes)
            except RuntimeError:  # the loop is closed: no one waits for these any more
                pass

    def _settle(self, batch: list[_Write], outcomes: list[tuple[bool, Any]]) -> None:
        for (_, done), (ok, value) in zip(batch, outcomes, strict=True):
            if done.done():
                continue  # its waiter was cancelled (a replica stopping)
            if ok:
                done.set_result(value)
            else:
                done.set_exception(value)
        if self._queue:
            self._start()
        else:
            self._busy = False


def _run_all(writes: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
    """(ok, result or exception) of each write, in order (in the writer thread)."""
    out: list[tuple[bool, Any]] = []
    for write in writes:
        try:
            out.append((True, write()))
        except Exception as exc:  # the replica that asked gets it; the others go on
            out.append((False, exc))
    return out
