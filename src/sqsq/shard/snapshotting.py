"""A replica's snapshots, for ``RaftReplica`` (through ``ReadyLoop``): its own, taken beside
the Ready loop, not in it; and a leader's, installed (``_install``) when the core accepts one.

Every replica of a shard reaches the same applied index at about the same moment, so they
all take their snapshot together. While the Ready loop waited for one (the state machine's
checkpoint, then the file packed and fsynced: 150-210 ms for 45 MB here), it wrote and sent
nothing: a leader's callers waited for its snapshot, then for its followers', which took
theirs together (sqsq-r3, send-1x100B: every call in flight waited 160 ms, then 210 ms).

Now only the applier waits, and only for the checkpoint, so that the checkpoint holds
exactly the snapshot's index: the log is still written, sent and acknowledged meanwhile, a
leader's commits go on and are applied once the checkpoint is taken, and a follower's
snapshot costs its leader nothing. The file is packed while the applier runs again. The
log is compacted behind the snapshot by the Ready loop (``_compact_to_snapshot``), which
is what writes the log.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from sqsq.raft import RaftNode, SnapshotMeta


class Snapshotting:
    """Mixed into ``RaftReplica`` (through ``ReadyLoop``), whose state it works on."""

    _snapshotting: asyncio.Task | None = None  # the snapshot under way
    _taken: SnapshotMeta | None = None  # taken, the log not yet compacted behind it

    def _snapshot_due(self, core: RaftNode) -> bool:
        """Whether to start a snapshot (or compact behind one): none under way, and enough
        applied since the last."""
        return self._snapshotting is None and (self._taken is not None or (
            core.applied - self._last_snapshot >= self.settings.compaction_entries))

    async def _snapshot_turn(self) -> None:
        """The Ready loop's part, between Readys: the log compacted behind the snapshot
        just taken, and the next one started if it is due."""
        if self._taken is not None:
            await self._compact_to_snapshot()
        core = self.core
        if core is None or self._stopped or self.fatal is not None or \
                not self._snapshot_due(core):
            return
        self._snapshotting = asyncio.create_task(self._take_snapshot(),
                                                 name=f"snapshot-{self.shard_id}")

    async def _take_snapshot(self) -> None:
        staging: Path | None = None
        try:
            hold = await self._hold_applier()  # the checkpoint must not race an apply
            try:
                core = self.core
                index = self.machine.applied_index
                if core is None or self._stopped or \
                        index - self._last_snapshot < self.settings.compaction_entries or \
                        core.log.term(index) is None or index > core.log.stable or \
                        index > core.applied:
                    return
                meta = core.snapshot_meta(index)
                staging = Path(tempfile.mkdtemp(dir=self.directory))
                pack = await asyncio.to_thread(self.machine.write_snapshot,
                                               str(staging / "state"), b"")
            finally:
                self._release_applier(hold)
            if self._stopped:
                return
            path = await asyncio.to_thread(self.storage.save_snapshot, meta,
                                           functools.partial(_copy, pack, staging))
            self._last_snapshot = meta.index
            self._taken = meta
            self.snapshots_written += 1
            self.snapshot_bytes = path.stat().st_size
            self._kick.set()  # the Ready loop compacts the log behind it
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a replica that cannot snapshot stops
            self._die(exc)
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            self._snapshotting = None

    async def _hold_applier(self) -> asyncio.Future[None]:
        """The applier's place, taken once the batch it is applying (if any) is done: no
        other batch starts meanwhile (``_paused``), so a stream of commits cannot keep it
        busy. Committed entries handed over while it is held wait for
        ``_release_applier``."""
        self._paused = True
        try:
            await self._applied_all()  # while paused: only the batch under way
            hold: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._applier = hold  # type: ignore[assignment]
            return hold
        finally:
            self._paused = False

    def _release_applier(self, hold: asyncio.Future[None]) -> None:
        """The applier free again: what was handed over meanwhile is applied."""
        if not hold.done():
            hold.set_result(None)
        if self._applier is hold:
            self._applier = None
            if self._to_apply and not self._stopped and self.fatal is None:
                self._applier = asyncio.create_task(self._apply_all(),
                                                    name=f"apply-{self.shard_id}")

    async def _snapshot_done(self) -> None:
        """Wait for the snapshot under way, if any (a snapshot from the leader is about to
        replace the state machine); one taken and not compacted behind is superseded."""
        task = self._snapshotting
        if task is not None:
            await asyncio.wait([task])
        self._taken = None

    async def _compact_to_snapshot(self) -> None:
        meta, self._taken = self._taken, None
        if meta is None or self.core is None:
            return
        keep = self.settings.keep_entries
        self.core.compact(meta, keep)
        await asyncio.to_thread(self.storage.compact, meta.index - keep)

    # ---- a leader's snapshot, received ------------------------------------------------

    def _install(self, meta: SnapshotMeta) -> None:
        """A snapshot the core accepted: durable in the Raft storage first (the log reset
        behind it), then the state machine swapped to it (worker thread)."""
        path = self._staged.pop((meta.index, meta.term))
        # Others received up to this one are superseded (the core never installs a snapshot
        # behind its commit): their files go too. Newer ones stay for the core to decide.
        for key in [k for k in list(self._staged) if k[0] <= meta.index]:
            stale = self._staged.pop(key, None)
            if stale is not None:
                stale.unlink(missing_ok=True)
        with self.storage.snapshots.open_data(path) as src:
            self.storage.install_snapshot(meta, lambda f: shutil.copyfileobj(src, f, 1 << 20))
        path.unlink(missing_ok=True)
        self._restore_state(meta)
        self._last_snapshot = meta.index

    def _restore_state(self, meta: SnapshotMeta) -> None:
        latest = self.storage.latest_snapshot()
        assert latest is not None and latest[0] == meta
        with self.storage.snapshots.open_data(latest[1]) as f:
            self.machine.install_from(f)


def _copy(pack: Callable[[], None], staging: Path, f: BinaryIO) -> None:
    """The checkpoint packed into its file, then copied into the snapshot's (worker
    thread)."""
    pack()
    with open(staging / "state", "rb") as src:
        shutil.copyfileobj(src, f, 1 << 20)
