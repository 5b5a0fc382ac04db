"""A replica's view of its log: what the last snapshot covers, the entries after it, how far
they are committed and how far the host has made them durable.

The membership in force is the last membership change in the log (committed or not), else
the snapshot's: a node uses a configuration as soon as it holds it, and drops it again if the
entry is truncated. With one change at a time, any two configurations in use at once differ
by one server, so their majorities overlap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqsq.raft.types import ConfChange, ConfState, Entry, EntryKind, SnapshotMeta

_CONF = EntryKind.CONF  # (a global is cheaper than an Enum's class attribute)


class RaftLog:
    def __init__(self, snapshot: SnapshotMeta, entries: Sequence[Entry] = (),
                 commit: int = 0) -> None:
        self.snap = snapshot  # where the log starts: the entries up to here are gone
        self.snapshot = snapshot  # the newest durable snapshot, what a follower is sent
        self.entries: list[Entry] = []
        self._confs: list[tuple[int, ConfState]] = []  # (index, membership from then on)
        self._extend(entries)
        for i, e in enumerate(self.entries):
            if e.index != snapshot.index + 1 + i:
                raise ValueError(f"log entries are not contiguous after {snapshot.index}")
        self.commit = max(commit, snapshot.index)
        if self.commit > self.last_index():
            raise ValueError(f"commit {self.commit} is past the log's end {self.last_index()}")
        self.stable = self.last_index()  # durable up to here
        self.unstable_from: int | None = None  # first index not yet handed to the host
        self.pending_snapshot: SnapshotMeta | None = None  # to install before the next apply

    # ---- reading --------------------------------------------------------------------------

    def first_index(self) -> int:
        return self.snap.index + 1

    def last_index(self) -> int:
        return self.snap.index + len(self.entries)

    def term(self, index: int) -> int | None:
        """The term of the entry at ``index``; None if compacted away or not there yet."""
        snap = self.snap
        at = index - snap.index - 1
        if at < 0:
            return snap.term if at == -1 else None
        entries = self.entries
        return entries[at].term if at < len(entries) else None

    def last_term(self) -> int:
        return self.term(self.last_index()) or 0

    def match_term(self, index: int, term: int) -> bool:
        return self.term(index) == term

    def is_up_to_date(self, index: int, term: int) -> bool:
        """Raft's election restriction: a candidate whose log ends at (index, term) holds at
        least every entry this log could have committed."""
        last_term = self.last_term()
        return term > last_term or (term == last_term and index >= self.last_index())

    def slice(self, lo: int, hi: int, max_bytes: int) -> tuple[Entry, ...]:
        """Entries lo..hi inclusive, cut at ``max_bytes`` of data (but at least one)."""
        start = lo - self.snap.index - 1
        if start < 0:
            raise ValueError(f"entry {lo} is compacted (snapshot at {self.snap.index})")
        out = self.entries[start : hi - self.snap.index]
        if len(out) > 1:
            size = 0
            for n, e in enumerate(out):
                size += len(e.data)
                if n and size > max_bytes:
                    return tuple(out[:n])
        return tuple(out)

    def between(self, lo: int, hi: int) -> tuple[Entry, ...]:
        """Entries lo..hi inclusive, however large."""
        start = lo - self.snap.index - 1
        if start < 0:
            raise ValueError(f"entry {lo} is compacted (snapshot at {self.snap.index})")
        return tuple(self.entries[start : hi - self.snap.index])

    def find_conflict(self, entries: Iterable[Entry]) -> int:
        """The index of the first entry that this log lacks or holds with another term;
        0 if it holds them all."""
        term = self.term
        for e in entries:
            if term(e.index) != e.term:
                return e.index
        return 0

    def conf(self) -> ConfState:
        return self._confs[-1][1] if self._confs else self.snap.conf

    def conf_at(self, index: int) -> ConfState:
        conf = self.snap.conf
        for at, c in self._confs:
            if at > index:
                break
            conf = c
        return conf

    def last_conf_index(self) -> int:
        return self._confs[-1][0] if self._confs else self.snap.index

    # ---- writing --------------------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        """Put ``entries`` in place, dropping whatever the log holds from the first one on.
        Callers decide whether that is allowed (only at a conflict, never below commit)."""
        if not entries:
            return
        start = entries[0].index
        if start <= self.snap.index or start > self.last_index() + 1:
            raise ValueError(f"entries at {start} do not fit a log of "
                             f"{self.first_index()}..{self.last_index()}")
        if start <= self.commit:
            raise AssertionError(f"truncating committed entry {start} (commit {self.commit})")
        del self.entries[start - self.snap.index - 1 :]
        while self._confs and self._confs[-1][0] >= start:
            self._confs.pop()
        self._extend(entries)
        self.stable = min(self.stable, start - 1)
        self.unstable_from = start if self.unstable_from is None else min(
            self.unstable_from, start)

    def _extend(self, entries: Iterable[Entry]) -> None:
        for e in entries:
            self.entries.append(e)
            if e.kind is _CONF:
                self._confs.append((e.index, ConfChange.decode(e.data).applied_to(self.conf())))

    def commit_to(self, index: int) -> bool:
        if index > self.commit:
            if index > self.last_index():
                raise AssertionError(f"commit {index} past the log's end {self.last_index()}")
            self.commit = index
            return True
        return False

    def take_unstable(self) -> tuple[Entry, ...]:
        """The entries to persist next, handed to the host once: what is appended (or
        replaced) after this is handed out by the next call."""
        if self.unstable_from is None:
            return ()
        out = tuple(self.entries[self.unstable_from - self.snap.index - 1 :])
        self.unstable_from = None
        return out

    def stable_to(self, index: int, term: int) -> None:
        """The host has persisted everything up to ``index`` (whose term was ``term``). The
        log may have changed since it was handed out: a replaced entry is not durable."""
        if self.term(index) == term:
            self.stable = max(self.stable, index)

    def restore(self, meta: SnapshotMeta) -> None:
        """Replace the whole log with a snapshot (one ahead of this log's commit)."""
        self.snap = self.snapshot = meta
        self.entries = []
        self._confs = []
        self.commit = meta.index
        self.stable = meta.index
        self.unstable_from = None
        self.pending_snapshot = meta

    def meta_at(self, index: int) -> SnapshotMeta:
        term = self.term(index)
        if term is None or index > self.stable:
            raise ValueError(f"no durable entry {index} in this log")
        return SnapshotMeta(index, term, self.conf_at(index))

    def compact(self, snapshot: SnapshotMeta, keep: int) -> None:
        """The host holds ``snapshot`` durably: forget the entries up to it, but for the last
        ``keep`` (a follower a little behind catches up from them, not from the snapshot)."""
        self.snapshot = snapshot
        start = max(self.snap.index, snapshot.index - keep)
        if start == self.snap.index:
            return
        point = self.meta_at(start)
        del self.entries[: start - self.snap.index]
        self._confs = [(at, c) for at, c in self._confs if at > start]
        self.snap = point
