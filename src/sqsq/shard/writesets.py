"""Write sets: what applying a committed entry wrote to the store, shared by the leader so
that its followers write it instead of applying the entry's commands again.

Applying the commands is most of what a follower spends on an entry (the queue logic: about
three quarters of its apply), and the result is known in advance: the core is deterministic,
every replica applies the same committed entries to the same state, so the leader's writes
for entry ``i`` are the follower's, byte for byte (an entry committed at ``i`` is the same
entry on every replica, whichever leader applied it). A write set names its entry's index,
term and checksum (``check``); a follower uses it only for the entry it names, and only if
the write set's own ``Meta`` record says it applied that index. Anything else (no write set
yet, one lost with a connection, a leader that stopped sharing, a payload that does not
decode) and the follower applies the entry's commands itself, as it always did: a write set
saves work and never decides anything.

The leader shares write sets of small entries only (``SHARED_ENTRY_BYTES``): a large
message's body would cross the network twice. A follower waits a little (``WAIT_S``) for the
write sets of entries it expects one for, while the leader is sharing: the leader applies an
entry once it is committed, and its next append may tell the follower of the commit before
the write set arrives.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Mapping

import msgpack

from sqsq.core import keys, records

# Entries this small have their write set shared; a follower expects one for each.
SHARED_ENTRY_BYTES = 64 << 10
# A write set larger than this is not sent (the follower is told so, and applies itself).
MAX_WRITE_SET_BYTES = 1 << 20
# How long a follower's applier waits for an expected write set before applying itself.
WAIT_S = 0.05
# Sharing counts as stopped once no write set came for this long (a new leader, one that
# shares nothing): the follower then applies at once.
SHARING_LAPSES_S = 1.0
# What a follower keeps of write sets not applied yet (a slow follower's, far ahead).
MAX_KEPT = 1024
MAX_KEPT_BYTES = 4 << 20

_PACKER = msgpack.Packer(use_bin_type=True)
_KEY_TYPES = frozenset({bytes})
_VALUE_TYPES = frozenset({bytes, type(None)})

# An entry's write set as sent: (index, term, check, packed writes or None: "not shared").
Shared = tuple[int, int, int, "bytes | None"]


def pack(writes: Mapping[bytes, bytes | None]) -> bytes | None:
    """An entry's writes (key order kept) as one payload; None if too large to share."""
    blob = _PACKER.pack(writes)
    return blob if len(blob) <= MAX_WRITE_SET_BYTES else None


def unpack(blob: bytes, index: int) -> dict[bytes, bytes | None]:
    """``pack``'s inverse, for entry ``index``; ``ValueError`` for anything else: a payload
    that is not a map of byte strings, or whose ``Meta`` does not say it applied ``index``."""
    try:
        writes = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    except Exception as e:  # noqa: BLE001 - untrusted bytes: whatever the parser trips on
        raise ValueError(f"write set: not msgpack ({type(e).__name__})") from None
    if type(writes) is not dict:
        raise ValueError("write set: not a map")
    # The types of every key and value, checked in C (a loop here cost a follower a micro-
    # second per message, on a dozen keys each).
    if not _KEY_TYPES.issuperset(map(type, writes)) or \
            not _VALUE_TYPES.issuperset(map(type, writes.values())):
        raise ValueError("write set: a key or value is not a byte string")
    meta = writes.get(keys.META_KEY)
    try:
        applied = None if meta is None else records.Meta.decode(meta).applied_index
    except Exception:  # noqa: BLE001 - untrusted bytes: a Meta record that does not decode
        applied = None
    if applied != index:
        raise ValueError(f"write set: not the one of entry {index}")
    return writes


def check(data: bytes) -> int:
    """The checksum that ties a write set to its entry's bytes: one routed to the wrong
    shard's replica, or meant for another entry at the same index, is not used."""
    return zlib.crc32(data)


def expected(data: bytes) -> bool:
    """Whether the leader shares the write set of an entry carrying ``data``."""
    return 0 < len(data) <= SHARED_ENTRY_BYTES


class Received:
    """A follower's write sets from the leader, by index, until it applies their entries."""

    def __init__(self) -> None:
        self._by_index: dict[int, tuple[int, int, bytes | None]] = {}
        self._bytes = 0
        self._last = float("-inf")  # when the last one came (monotonic)
        self._waiter: tuple[int, asyncio.Future[None]] | None = None
        # entries applied from a write set, and by running their commands; write sets dropped
        self.used = self.applied_self = self.dropped = 0

    def add(self, index: int, term: int, entry_check: int, blob: bytes | None,
            applied: int) -> None:
        """One write set (None: the leader did not share that entry's), received when
        ``applied`` was the state machine's index."""
        self._last = time.monotonic()
        size = 0 if blob is None else len(blob)
        if index <= applied or len(self._by_index) >= MAX_KEPT or \
                self._bytes + size > MAX_KEPT_BYTES:
            self.dropped += 1
        else:
            old = self._by_index.get(index)
            if old is not None and old[2] is not None:
                self._bytes -= len(old[2])
            self._by_index[index] = (term, entry_check, blob)
            self._bytes += size
        waiter = self._waiter
        if waiter is not None and index >= waiter[0]:
            _settle(waiter[1])

    def take(self, index: int, term: int, entry_check: int) -> bytes | None:
        """The write set of the entry at ``index`` of ``term`` whose bytes have the checksum
        ``entry_check``, if one came; it is forgotten."""
        kept = self._by_index.pop(index, None)
        if kept is None:
            return None
        if kept[2] is not None:
            self._bytes -= len(kept[2])
        return kept[2] if kept[:2] == (term, entry_check) else None

    def forget_to(self, applied: int) -> None:
        """Drop what is kept for entries up to ``applied`` (applied another way)."""
        for index in [i for i in self._by_index if i <= applied]:
            self.take(index, -1, -1)

    def has(self, index: int) -> bool:
        """Whether the write set of ``index`` came (``wait`` would return at once)."""
        return index in self._by_index

    def sharing(self) -> bool:
        return time.monotonic() - self._last < SHARING_LAPSES_S

    def wake(self) -> None:
        """End a wait at once (this replica now leads: it applies for itself)."""
        if self._waiter is not None:
            _settle(self._waiter[1])

    async def wait(self, index: int, timeout_s: float = WAIT_S) -> None:
        """Until the write set of ``index`` (or a later one) came, or ``timeout_s`` passed."""
        if index in self._by_index:
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._waiter = (index, done)
        timer = loop.call_later(timeout_s, _settle, done)
        try:
            await done
        finally:
            timer.cancel()
            self._waiter = None


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
