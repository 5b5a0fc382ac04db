"""What Raft puts on the wire between two nodes: batches of (shard, message), snapshot
chunks and their acknowledgements, a leader's write sets, as msgpack of plain arrays.

Never pickle: a frame comes from the network, and unpickling runs what it is told to. Every
payload starts with ``FORMAT_VERSION``, so a node can refuse a format it does not know rather
than misread it (a rolling upgrade changes the format by adding a version, never by changing
what an old one means). Decoding checks every field's type and range: whatever does not fit
raises ``ValueError``, and the transport cuts the connection that sent it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack

from sqsq.raft.types import ConfState, Entry, EntryKind, Message, MsgType, SnapshotMeta

FORMAT_VERSION = 1
MAX_ID_CHARS = 1024  # a node or replica id; anything longer is not one of ours
_U64_MAX = (1 << 64) - 1
_E = TypeVar("_E", bound=enum.IntEnum)

# One Packer for every payload (as sqsq.core.records does): packing plain lists, ints, strs,
# bytes and None runs no Python code, so a ``pack`` ends under the GIL, and it resets after.
_PACKER = msgpack.Packer(use_bin_type=True)


# ---- messages ------------------------------------------------------------------------------

def _pack_message(m: Message) -> list[Any]:
    snap = m.snapshot
    return [
        int(m.type), m.to, m.frm, m.term, m.log_term, m.index,
        [[e.index, e.term, e.data, int(e.kind)] for e in m.entries],
        m.commit, m.reject, m.hint,
        None if snap is None else
        [snap.index, snap.term, sorted(snap.conf.voters), sorted(snap.conf.learners)],
        m.context,
    ]


def encode_messages(batch: list[tuple[int, Message]]) -> bytes:
    """A batch of (shard id, message) pairs as one payload."""
    return _PACKER.pack([FORMAT_VERSION, [[shard, _pack_message(m)] for shard, m in batch]])


def decode_messages(data: bytes | memoryview) -> list[tuple[int, Message]]:
    """``encode_messages``' inverse; ``ValueError`` for anything it would not have made."""
    body = _versioned(data, 2, "message batch")
    pairs = _list(body[1], "batch")
    out = []
    for pair in pairs:
        if type(pair) is list and len(pair) == 2 and type(pair[0]) is int and \
                0 <= pair[0] <= _U64_MAX:
            out.append((pair[0], _unpack_message(pair[1])))
            continue
        shard, raw = _list(pair, "batch item", 2)
        out.append((_uint(shard, "shard"), _unpack_message(raw)))
    return out


_MSG_TYPES = {int(t): t for t in MsgType}
_ENTRY_KINDS = {int(k): k for k in EntryKind}


def _unpack_message(raw: object) -> Message:
    # The common case checked in one expression (a call per field costs more than the rest
    # of decoding); anything it does not pass goes the field-by-field way, which says what
    # is wrong. Entries and the snapshot are checked in full either way.
    if type(raw) is list and len(raw) == 12:
        (mtype, to, frm, term, log_term, index, entries, commit, reject, hint, snap,
         context) = raw
        kind = _MSG_TYPES.get(mtype) if type(mtype) is int else None
        if (kind is not None and type(to) is str and type(frm) is str
                and 0 < len(to) <= MAX_ID_CHARS and 0 < len(frm) <= MAX_ID_CHARS
                and type(term) is int and type(log_term) is int and type(index) is int
                and type(commit) is int and type(hint) is int
                and 0 <= term <= _U64_MAX and 0 <= log_term <= _U64_MAX
                and 0 <= index <= _U64_MAX and 0 <= commit <= _U64_MAX
                and 0 <= hint <= _U64_MAX and type(reject) is bool
                and type(entries) is list and type(context) is bytes):
            return Message(kind, to, frm, term, log_term, index,
                           tuple([_unpack_entry(e) for e in entries]) if entries else (),
                           commit, reject, hint,
                           None if snap is None else _unpack_snapshot(snap), context)
    return _unpack_message_checked(raw)


def _unpack_message_checked(raw: object) -> Message:
    (mtype, to, frm, term, log_term, index, entries, commit, reject, hint, snap,
     context) = _list(raw, "message", 12)
    return Message(
        type=_enum(MsgType, mtype, "message type"),
        to=_id(to, "to"),
        frm=_id(frm, "frm"),
        term=_uint(term, "term"),
        log_term=_uint(log_term, "log_term"),
        index=_uint(index, "index"),
        entries=tuple(_unpack_entry(e) for e in _list(entries, "entries")),
        commit=_uint(commit, "commit"),
        reject=_bool(reject, "reject"),
        hint=_uint(hint, "hint"),
        snapshot=None if snap is None else _unpack_snapshot(snap),
        context=_bytes(context, "context"),
    )


def _unpack_entry(raw: object) -> Entry:
    if type(raw) is list and len(raw) == 4:
        index, term, data, kind = raw
        if (type(index) is int and type(term) is int and type(data) is bytes
                and type(kind) is int and kind in _ENTRY_KINDS
                and 0 <= index <= _U64_MAX and 0 <= term <= _U64_MAX):
            return Entry(index, term, data, _ENTRY_KINDS[kind])
    index, term, data, kind = _list(raw, "entry", 4)
    return Entry(_uint(index, "entry index"), _uint(term, "entry term"),
                 _bytes(data, "entry data"), _enum(EntryKind, kind, "entry kind"))


def _unpack_snapshot(raw: object) -> SnapshotMeta:
    index, term, voters, learners = _list(raw, "snapshot", 4)
    return SnapshotMeta(
        _uint(index, "snapshot index"), _uint(term, "snapshot term"),
        ConfState(frozenset(_id(v, "voter") for v in _list(voters, "voters")),
                  frozenset(_id(v, "learner") for v in _list(learners, "learners"))))


# ---- snapshot chunks -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of a snapshot file in transfer ``transfer`` (the sender's number for it).
    Every chunk names the snapshot's (shard, index, term), so a receiver can tell a piece of
    another transfer from the next piece of this one; the first (``seq`` 0) carries the
    SNAPSHOT message that goes to the shard's Raft once the file is whole."""

    transfer: int
    seq: int
    last: bool
    shard: int
    index: int
    term: int
    data: bytes
    message: Message | None = None


def encode_chunk(chunk: Chunk) -> bytes:
    message = None if chunk.message is None else _pack_message(chunk.message)
    return _PACKER.pack([FORMAT_VERSION, chunk.transfer, chunk.seq, chunk.last, chunk.shard,
                         chunk.index, chunk.term, chunk.data, message])


def decode_chunk(data: bytes | memoryview) -> Chunk:
    (_, transfer, seq, last, shard, index, term, payload,
     message) = _versioned(data, 9, "snapshot chunk")
    chunk = Chunk(_uint(transfer, "transfer"), _uint(seq, "seq"), _bool(last, "last"),
                  _uint(shard, "shard"), _uint(index, "snapshot index"),
                  _uint(term, "snapshot term"), _bytes(payload, "chunk data"),
                  None if message is None else _unpack_message(message))
    if (chunk.seq == 0) != (chunk.message is not None):
        raise ValueError("a snapshot's first chunk, and only it, carries its message")
    m = chunk.message
    if m is not None and (m.type is not MsgType.SNAPSHOT or m.snapshot is None
                          or (m.snapshot.index, m.snapshot.term) != (chunk.index, chunk.term)):
        raise ValueError("a snapshot chunk's message is not that snapshot's")
    return chunk


def encode_ack(transfer: int, ok: bool) -> bytes:
    """The receiver's word on a transfer: whole and durable (True), or discarded."""
    return _PACKER.pack([FORMAT_VERSION, transfer, ok])


def decode_ack(data: bytes | memoryview) -> tuple[int, bool]:
    _, transfer, ok = _versioned(data, 3, "snapshot acknowledgement")
    return _uint(transfer, "transfer"), _bool(ok, "ok")


# ---- write sets ----------------------------------------------------------------------------

def encode_write_sets(batch: list[tuple[int, int, int, int, bytes | None]]) -> bytes:
    """A leader's write sets (``sqsq.shard.writesets``) for one peer: (shard, index, term,
    entry checksum, packed writes or None for "not shared") each."""
    return _PACKER.pack([FORMAT_VERSION, batch])


def decode_write_sets(data: bytes | memoryview) -> list[tuple[int, int, int, int, bytes | None]]:
    """``encode_write_sets``' inverse (the writes stay packed until applied)."""
    out = []
    for item in _list(_versioned(data, 2, "write sets")[1], "write sets"):
        shard, index, term, entry_check, blob = _list(item, "write set", 5)
        if blob is not None:
            _bytes(blob, "write set")
        out.append((_uint(shard, "shard"), _uint(index, "index"), _uint(term, "term"),
                    _uint(entry_check, "entry checksum"), blob))
    return out


# ---- checks --------------------------------------------------------------------------------

def _versioned(data: bytes | memoryview, length: int, what: str) -> list[Any]:
    try:
        # Untrusted bytes: whatever the parser trips on (bad types, truncation, trailing
        # bytes, unknown extension types) is one thing to us, a payload we did not make.
        body = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{what}: not msgpack ({type(e).__name__})") from None
    if type(body) is list and len(body) == length and type(body[0]) is int and \
            body[0] == FORMAT_VERSION:
        return body  # the common case, in one test
    if not isinstance(body, list) or not body:
        raise ValueError(f"{what}: not a versioned array")
    if body[0] != FORMAT_VERSION or type(body[0]) is not int:
        raise ValueError(f"{what}: format version {body[0]!r:.20}, this node reads "
                         f"{FORMAT_VERSION}")
    return _list(body, what, length)


def _list(value: object, what: str, length: int | None = None) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{what}: expected an array, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise ValueError(f"{what}: expected {length} fields, got {len(value)}")
    return value


def _uint(value: object, what: str) -> int:
    # ``type(...) is int``: msgpack's booleans are Python bools, which isinstance calls ints.
    if type(value) is not int or not 0 <= value <= _U64_MAX:
        raise ValueError(f"{what}: expected an unsigned 64-bit integer, got {value!r:.40}")
    return value


def _bool(value: object, what: str) -> bool:
    if type(value) is not bool:
        raise ValueError(f"{what}: expected a boolean, got {value!r:.40}")
    return value


def _bytes(value: object, what: str) -> bytes:
    if type(value) is not bytes:
        raise ValueError(f"{what}: expected bytes, got {type(value).__name__}")
    return value


def _id(value: object, what: str) -> str:
    if type(value) is not str or not 0 < len(value) <= MAX_ID_CHARS:
        raise ValueError(f"{what}: expected a node id, got {value!r:.40}")
    return value


def _enum(cls: type[_E], value: object, what: str) -> _E:
    if type(value) is not int:
        raise ValueError(f"{what}: expected an integer, got {value!r:.40}")
    try:
        return cls(value)
    except ValueError:
        raise ValueError(f"{what}: unknown value {value}") from None
