"""A replica's disk in the simulator: what survives a crash is what was synced.

Writes go to a buffer; ``sync`` makes them durable in order; a crash drops the buffer, and
may leave a torn last record (its header written, its payload not). The operations that
touch several things at once (compaction, installing a snapshot) can be cut by a crash at
any step in between. Each safeguard the real storage must have is a switch here, so a test
can turn it off and watch the checker catch what goes wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sqsq.raft import ConfState, Entry, HardState, SnapshotMeta, bootstrap
from sqsq.sim.machine import MachineSnapshot


@dataclass(frozen=True)
class DiskSafeguards:
    segment_compaction: bool = True  # finding 1: drop whole segments, never rewrite live ones
    checksums: bool = True  # finding 6: a torn last record is cut off, not read as data
    durable_hard_state: bool = True  # finding 6: term and vote are fsynced with the entries
    staged_snapshot_install: bool = True  # finding 7: the old state stays until the new is in
    failed_install_stops: bool = True  # finding 5: a failed install is never acknowledged


class ReplicaUnrecoverable(Exception):
    """The disk holds no state the replica can open (a broken install, say)."""


@dataclass
class Record:
    entry: Entry
    torn: bool = False


@dataclass
class SimDisk:
    guard: DiskSafeguards = field(default_factory=DiskSafeguards)
    hard_state: HardState = field(default_factory=HardState)
    snap_meta: SnapshotMeta | None = None
    snap_data: MachineSnapshot | None = None
    state_missing: bool = False  # an install deleted the live state and did not finish
    records: list[Record] = field(default_factory=list)
    pending: list[tuple[str, object]] = field(default_factory=list)
    syncs: int = 0
    lazy_hard_state: HardState | None = None

    @classmethod
    def bootstrapped(cls, voters: frozenset[str], guard: DiskSafeguards) -> SimDisk:
        """A first member's disk: the group's membership is the log's first entry."""
        hs, _, entries = bootstrap(voters)
        return cls(guard, hard_state=hs, records=[Record(e) for e in entries])

    def write_entries(self, entries: tuple[Entry, ...]) -> None:
        self.pending.append(("entries", entries))

    def write_hard_state(self, hs: HardState) -> None:
        if self.guard.durable_hard_state:
            self.pending.append(("hs", hs))
        else:
            self.lazy_hard_state = hs  # mutant: rewritten now and then, without fsync

    def sync(self) -> None:
        for kind, value in self.pending:
            if kind == "entries":
                self._put_entries(value)  # type: ignore[arg-type]
            else:
                self.hard_state = value  # type: ignore[assignment]
        self.pending.clear()
        self.syncs += 1
        if self.lazy_hard_state is not None and self.syncs % 10 == 0:
            self.hard_state = self.lazy_hard_state

    def _put_entries(self, entries: tuple[Entry, ...], torn_last: bool = False) -> None:
        start = entries[0].index
        self.records = [r for r in self.records if r.entry.index < start]
        self.records.extend(Record(e) for e in entries)
        if torn_last:
            self.records[-1].torn = True

    def crash(self, torn: bool) -> None:
        """Power lost: what was not synced is gone; the first unsynced append may be torn."""
        self.lazy_hard_state = None
        for kind, value in self.pending:
            if kind == "entries" and torn:
                self._put_entries(value, torn_last=True)  # type: ignore[arg-type]
                break
        self.pending.clear()

    def load(self) -> tuple[HardState, SnapshotMeta, tuple[Entry, ...], MachineSnapshot | None]:
        if self.state_missing:
            raise ReplicaUnrecoverable("the state directory is gone (an install was cut)")
        meta = self.snap_meta or SnapshotMeta(0, 0, ConfState(frozenset()))
        entries: list[Entry] = []
        for r in self.records:
            if r.entry.index <= meta.index:
                continue
            if r.torn:
                if self.guard.checksums:
                    break  # the checksum fails: a torn tail is cut off
                r = Record(replace(r.entry, data=r.entry.data[: len(r.entry.data) // 2]))
            if entries and r.entry.index != entries[-1].index + 1:
                break
            entries.append(r.entry)
        self.records = [Record(e) for e in entries]
        hs = self.hard_state
        last = entries[-1].index if entries else meta.index
        if hs.commit > last:
            # The hard state was synced with the entries it commits; only a broken disk
            # lands here, and the replica must not open.
            raise ReplicaUnrecoverable(f"commit {hs.commit} past the log's end {last}")
        return hs, meta, tuple(entries), self.snap_data

    def save_snapshot(self, meta: SnapshotMeta, data: MachineSnapshot, keep: int,
                      cut_after: int | None = None) -> bool:
        """A snapshot taken here: written durably, then the log before it dropped but for
        the last ``keep`` entries. With ``cut_after``, a crash strikes that many steps into
        the compaction: False."""
        self.snap_meta, self.snap_data = meta, data
        kept = [r for r in self.records if r.entry.index > meta.index - keep]
        if self.guard.segment_compaction or cut_after is None:
            self.records = kept  # whole segments go; the kept ones are never rewritten
            return cut_after is None
        self.records = kept[:cut_after]  # mutant: cleared, then re-added one by one
        return False

    def install(self, meta: SnapshotMeta, data: MachineSnapshot, cut: bool = False) -> bool:
        """A snapshot received from the leader replaces the state and the log. With ``cut``,
        a crash strikes between the steps of the install: False."""
        if not self.guard.staged_snapshot_install and cut:
            self.state_missing = True  # mutant: the live state deleted, the rename not done
            return False
        if cut:
            return False  # staged: the old state is whole until the rename
        self.snap_meta, self.snap_data = meta, data
        self.records = []
        return True
