"""Snapshots written beside the tick thread: fix 7 of ``sqsq.shard.raft``.

pysyncobj 0.3.17 runs a custom serializer (ours: a RocksDB checkpoint packed into one file,
fsynced) inside its tick thread and waits for it. The tick thread is also what sends
heartbeats and commits entries, so a leader writing a snapshot stops serving for as long as
the write takes: about 100 ms for a 29 MB store here, and past the election timeout (0.4 s)
the followers would elect another leader while it writes.

``BackgroundSerializer`` replaces pysyncobj's ``Serializer``. The state machine's
``write_snapshot`` does in the tick thread only what must happen at that point of the log
(the checkpoint, a hard-linked copy of the store) and returns the rest (packing and fsyncing
the file), which runs in a thread of its own. pysyncobj learns of the outcome on a later tick
(``checkSerializing``), and only then drops the journal entries the new dump replaces; until
then the old dump and the journal stay as they were, so a crash mid-write loses nothing.
A dump that arrives from the leader while ours is being written wins: ours is discarded.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from pysyncobj.atomic_replace import atomicReplace
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.serializer import Serializer

log = logging.getLogger("sqsq.raft")


class _Job:
    """One dump being written: ``finish`` writes ``tmp``, then it replaces the dump."""

    def __init__(self, entry_id: Any, tmp: str, finish: Callable[[], None]) -> None:
        self.entry_id = entry_id
        self.tmp = tmp
        self.finish = finish
        self.cancelled = False  # a dump from the leader replaced ours meanwhile
        self.ok = False
        self.done = threading.Event()


class BackgroundSerializer(Serializer):
    """pysyncobj's serializer, with a custom serializer's slow part moved off the tick
    thread. A custom serializer returns None (it wrote everything) or a callable that
    finishes the file."""

    def __init__(self, fileName: str, transmissionBatchSize: int, tryUseFork: bool,  # noqa: N803
                 serializer: Any, deserializer: Any, serializeChecker: Any) -> None:
        super().__init__(fileName, transmissionBatchSize, tryUseFork, serializer,
                         deserializer, serializeChecker)
        self._file = fileName
        self._write = serializer
        self._lock = threading.Lock()  # the dump file's name: our rename or the leader's
        self._job: _Job | None = None
        self.written = 0  # dumps of ours that became the dump file, since start (metrics)
        self.written_bytes = 0  # the last one's size

    def serialize(self, data: Any, id: Any) -> None:  # noqa: A002 - pysyncobj's name
        if self._write is None or self._file is None:
            super().serialize(data, id)
            return
        if self._job is not None or self._Serializer__pid != 0:
            return  # one dump at a time
        self._Serializer__currentID = id
        tmp = self._file + ".tmp"
        try:
            finish = self._write(tmp, data[1:])
            if finish is None:  # written in full: replace the dump now, as pysyncobj does
                self._replace(tmp)
                self._Serializer__pid = -1
                return
        except Exception:
            log.exception("writing a snapshot failed")
            self._Serializer__pid = -2
            return
        job = self._job = _Job(id, tmp, finish)
        self._Serializer__pid = -3  # under way: the old dump is not sent meanwhile
        threading.Thread(target=self._run, args=(job,), name="sqsq-snapshot",
                         daemon=True).start()

    def _run(self, job: _Job) -> None:
        try:
            job.finish()
            with self._lock:
                if job.cancelled:
                    os.unlink(job.tmp)
                else:
                    self._replace(job.tmp)
                    job.ok = True
        except Exception:
            log.exception("writing a snapshot failed")
        finally:
            job.done.set()

    def _replace(self, tmp: str) -> None:
        size = os.path.getsize(tmp)
        atomicReplace(tmp, self._file)
        self.written_bytes = size
        self.written += 1

    def checkSerializing(self) -> tuple[Any, Any]:  # noqa: N802 - pysyncobj's name
        job = self._job
        if job is not None:
            if not job.done.is_set():
                return SERIALIZER_STATE.SERIALIZING, job.entry_id
            self._job = None
            ok = job.ok and not job.cancelled  # a leader's dump may have replaced ours since
            self._Serializer__pid = -1 if ok else -2  # reported below, as pysyncobj does
        return super().checkSerializing()

    def setTransmissionData(self, data: Any) -> bool:  # noqa: N802 - pysyncobj's name
        # A dump from the leader is newer than the one we are writing: ours must not
        # replace it.
        with self._lock:
            if self._job is not None:
                self._job.cancelled = True
            return super().setTransmissionData(data)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Until the dump under way (if any) is written; whether none is left (tests)."""
        job = self._job
        return job is None or job.done.wait(timeout_s)
