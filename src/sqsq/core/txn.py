"""Ordered key-value read protocol and a buffered write overlay (pure: no I/O).

The queue state machine runs every command against a `Txn` layered over the
shard's store. The Txn buffers writes (read-your-writes) so a command, or a group
of commands, can be committed as one atomic batch by the owner, or dropped.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator
from typing import Protocol

__all__ = ["KVReader", "Txn", "prefix_end"]


class KVReader(Protocol):
    def get(self, key: bytes) -> bytes | None: ...

    def scan(
        self, start: bytes, end: bytes, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs with start <= key < end, ascending (descending if reverse), lazily."""
        ...


def prefix_end(prefix: bytes) -> bytes:
    """Smallest key greater than every key starting with `prefix`.

    Trailing 0xff bytes cannot be incremented, so they are dropped before
    incrementing the last remaining byte. A prefix made only of 0xff bytes (or the
    empty prefix) has no such key: ValueError, rather than a sentinel that would
    be ambiguous as a scan bound.
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        raise ValueError(f"no key bounds the prefix {prefix!r} from above")
    return stripped[:-1] + bytes((stripped[-1] + 1,))


class _Savepoint:
    """Opaque token: the undo-log length at the time it was taken."""

    __slots__ = ("owner", "mark")

    def __init__(self, owner: Txn, mark: int) -> None:
        self.owner = owner
        self.mark = mark


_ABSENT = object()  # undo-log marker: the key was not in the overlay before


class Txn:
    """Buffered writes over a KVReader with read-your-writes.

    Nothing reaches the reader: the owner takes `writes()` and commits them
    atomically. Not thread-safe (one command stream owns it).

    Forward scans skip runs of base keys that this transaction deleted and an
    earlier scan walked (see `_dead`), so a base that changes while the Txn
    lives may go unseen inside such a run. An applied entry's base does not
    change; a scratch Txn over a live store (a leader's look at a receive) sees at
    worst what a scan started a moment earlier would have seen.
    """

    __slots__ = ("_base", "_base_get", "_ov", "_keys", "_sorted", "_undo", "_logging", "_ver",
                 "_dead", "memo")

    def __init__(self, base: KVReader) -> None:
        self._base = base
        self._base_get = base.get  # bound once: a read that misses the overlay is the norm
        # key -> value, or None for a delete that must hide the base key
        self._ov: dict[bytes, bytes | None] = {}
        # the overlay's keys, sorted. A plain list with C bisect/insort makes
        # merged scans ~2-3x faster than SortedDict for the small overlays of a
        # command or group; inserts are an O(n) memmove, ~2us/put at 10k
        # distinct random keys, ~12us at 100k (ascending keys stay cheap).
        # Until the first scan (or rollback, or writes()) keys are only appended, then sorted
        # once: a send's writes need no order until the batch is taken, and one sort costs
        # about a third of the insorts.
        self._keys: list[bytes] = []
        self._sorted = False
        # (key, previous overlay entry or _ABSENT); only kept once a savepoint
        # exists, so single-command txns pay nothing for it
        self._undo: list[tuple[bytes, object]] = []
        self._logging = False
        # bumped on every overlay change so running scans know to re-bisect
        self._ver = 0
        # first -> last key of a run of consecutive base keys that this transaction deleted,
        # as a forward scan found them. A later scan that meets the first jumps past the last
        # (when every overlay key in between is still a delete) instead of stepping through
        # them: the receives of one entry each start where the index's floor is, and without
        # this the n-th receive stepped over what the n-1 before it had taken. It relies on
        # the base not changing while the transaction lives, as an applied entry's does not.
        # A run that begins where a scan began is kept under the scan's start, which need not
        # be a key: every base key from there to the last is deleted, and the next scan from
        # the same start (the next receive, while the floor has not moved) opens its base
        # iterator past the run at once instead of at the run's first key and again after.
        self._dead: dict[bytes, bytes] = {}
        # Free for the layer above: records it wrote, by key, with the bytes it wrote them as,
        # for the next command of the same entry (see ShardState). A record is used only while
        # the Txn still holds those very bytes, so a rollback needs to forget nothing here.
        self.memo: dict[bytes, tuple[bytes, object]] = {}

    # -- point operations ---------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        value = self._ov.get(key, _ABSENT)
        return self._base_get(key) if value is _ABSENT else value  # type: ignore[return-value]

    # put and delete are the same code, not one calling a shared helper: a command makes a
    # dozen of them per message, and the extra call was a tenth of their cost.
    def put(self, key: bytes, value: bytes) -> None:
        ov = self._ov
        if self._logging:
            self._undo.append((key, ov.get(key, _ABSENT)))
        if key not in ov:
            if self._sorted:
                insort(self._keys, key)
            else:
                self._keys.append(key)
        ov[key] = value
        self._ver += 1

    def delete(self, key: bytes) -> None:
        # Always buffer a tombstone, even if the base lacks the key: checking
        # would cost a base read, and deleting a missing key is harmless.
        ov = self._ov
        if self._logging:
            self._undo.append((key, ov.get(key, _ABSENT)))
        if key not in ov:
            if self._sorted:
                insort(self._keys, key)
            else:
                self._keys.append(key)
        ov[key] = None
        self._ver += 1

    # -- savepoints ----------------------------------------------------------

    def savepoint(self) -> object:
        self._logging = True
        return _Savepoint(self, len(self._undo))

    def rollback(self, sp: object) -> None:
        """Undo the writes made after `sp`. The savepoint stays usable; savepoints
        taken after it become invalid."""
        if not isinstance(sp, _Savepoint) or sp.owner is not self:
            raise ValueError("savepoint does not belong to this transaction")
        self._keep_sorted()
        self._dead.clear()  # a delete undone makes its base key live again
        undo, ov, keys = self._undo, self._ov, self._keys
        if sp.mark > len(undo):
            raise ValueError("savepoint was invalidated by an earlier rollback")
        while len(undo) > sp.mark:
            key, prev = undo.pop()
            if prev is _ABSENT:
                del ov[key]
                del keys[bisect_left(keys, key)]
            else:
                ov[key] = prev
        self._ver += 1

    # -- results -------------------------------------------------------------

    def writes(self) -> dict[bytes, bytes | None]:
        """Buffered writes, in key order; None means delete.

        In key order because that is how RocksDB's memtable takes a batch fastest: each insert
        starts its skip-list search where the previous one ended (~40% less per key than the
        order the writes were made in, measured on 500-key batches).
        """
        self._keep_sorted()
        ov = self._ov
        return {key: ov[key] for key in self._keys}

    def _keep_sorted(self) -> None:
        """Sort the overlay's keys, and keep them sorted from now on (scans bisect them)."""
        if not self._sorted:
            self._keys.sort()
            self._sorted = True

    def __len__(self) -> int:
        return len(self._ov)

    # -- range scan ----------------------------------------------------------

    def scan(
        self, start: bytes, end: bytes, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        """Merge the base scan with the overlay, in key order, lazily.

        The overlay is not snapshotted: the next overlay key is found by
        bisecting from the last key handled, again whenever the overlay changed
        (version counter), so puts/deletes made by the caller while iterating
        are honoured for keys not yet reached (a key deleted ahead of the cursor
        is not yielded; a key put ahead of it is). The base is pulled one pair at
        a time.
        """
        # Not a generator itself: the one below runs nothing until it is first asked (the
        # laziness is the same), and a scan's every pair passes one generator, not two.
        if start >= end:
            return iter(())
        return self._scan_rev(start, end) if reverse else self._scan_fwd(start, end)

    def _deleted_throughout(self, lo: bytes, hi: bytes) -> bool:
        """Whether every overlay key in [lo, hi] is a delete."""
        ov, keys = self._ov, self._keys
        for i in range(bisect_left(keys, lo), bisect_right(keys, hi)):
            if ov[keys[i]] is not None:
                return False
        return True

    def _run_after(self, key: bytes, run: bytes | None) -> bytes | None:
        """The run a forward scan is in once the caller is done with the base key it was
        given: a receive deletes what it takes, and a key deleted so is as dead as one the
        scan found deleted."""
        if self._ov.get(key, _ABSENT) is not None:
            return None
        if run is None:
            return key
        self._dead[run] = key
        return run

    def _scan_fwd(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        self._keep_sorted()
        ov, keys, dead, base = self._ov, self._keys, self._dead, self._base
        last: bytes | None = None
        skip_to = dead.get(start)
        if skip_to is not None and not self._deleted_throughout(start, skip_to):
            del dead[start]  # something in it was written since
            skip_to = None
        if skip_to is None:
            base_it = iter(base.scan(start, end))
        else:
            base_it = iter(base.scan(skip_to + b"\x00", end))
            last = skip_to
        b = next(base_it, None)
        o: bytes | None = None
        ver = -1  # overlay version `o` was computed at; -1 forces a lookup
        # Where the run of deleted base keys we are in began (None: not in one). Every base
        # key from the scan's start is in it until one is not deleted.
        run: bytes | None = start
        while True:
            if ver != self._ver:
                # smallest overlay key in [start, end) beyond the cursor
                ver = self._ver
                i = bisect_left(keys, start) if last is None else bisect_right(keys, last)
                o = keys[i] if i < len(keys) else None
                if o is not None and o >= end:
                    o = None
            if o is None:
                if b is None:
                    return
                # base keys beyond the cursor are not in the overlay (else o <= them)
                last = b[0]
                yield b
                run = self._run_after(last, run)
                b = next(base_it, None)
                continue
            if b is not None and b[0] < o:
                last = b[0]
                yield b
                run = self._run_after(last, run)
                b = next(base_it, None)
                continue
            if b is not None and b[0] == o:  # shadowed by the overlay
                if ov[o] is None:  # deleted here: in a run of such base keys
                    if run is None:
                        run = o
                    skip_to = dead.get(o)
                    if skip_to is not None:
                        if skip_to > o and self._deleted_throughout(o, skip_to):
                            base_it = iter(base.scan(skip_to + b"\x00", end))
                            b = next(base_it, None)
                            last, ver = skip_to, -1
                            dead[run] = skip_to
                            continue
                        del dead[o]  # something in it was written since: step through it
                    if o != run:
                        dead[run] = o
                b = next(base_it, None)
            last = o
            ver = -1  # o is consumed
            v = ov[o]
            if v is not None:
                run = None
                yield o, v

    def _scan_rev(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        self._keep_sorted()
        ov, keys = self._ov, self._keys
        base_it = iter(self._base.scan(start, end, reverse=True))
        b = next(base_it, None)
        last: bytes | None = None
        o: bytes | None = None
        ver = -1
        while True:
            if ver != self._ver:
                # largest overlay key in [start, end) below the cursor
                ver = self._ver
                i = bisect_left(keys, end if last is None else last) - 1
                o = keys[i] if i >= 0 else None
                if o is not None and o < start:
                    o = None
            if o is None:
                if b is None:
                    return
                last = b[0]
                yield b
                b = next(base_it, None)
                continue
            if b is not None and b[0] > o:
                last = b[0]
                yield b
                b = next(base_it, None)
                continue
            if b is not None and b[0] == o:
                b = next(base_it, None)
            last = o
            ver = -1
            v = ov[o]
            if v is not None:
                yield o, v
