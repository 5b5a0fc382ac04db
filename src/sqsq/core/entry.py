"""The Raft log entry: the commands a leader proposes and every replica applies, as bytes.

Why a format of our own:

- Deterministic replicas. The leader stamps the time and every random value (message ids,
  receipt nonces, task handles) into the commands before proposing; each replica must rebuild
  exactly those commands. Encoding is a pure function of the entry, and decoding gives back
  equal frozen dataclasses: tuples stay tuples, bytes stay bytes, str stays str (a lone
  surrogate included, so the state machine, not the codec, decides what is valid).
- No pickle. An entry crosses the network and outlives the code that wrote it; pickle runs
  code named by its bytes and ties the log to module and class names. This is msgpack of
  plain arrays, ints, strs, bytes and None: data only.
- Versioned and closed. ``[ENTRY_VERSION, now_ms, [command, ...]]``, each command
  ``[tag, field, ...]`` with its fields in declaration order and its tag from the explicit
  table below. A version or tag a replica does not know, or a command of the wrong shape, is
  a ValueError: a replica must stop, not guess.

Both directions check every value against the command's declared field types, so the leader
cannot propose an entry its replicas would refuse, and ``decode_entry(encode_entry(e)) == e``
for every entry ``encode_entry`` accepts. Ints must fit msgpack's 64 bits. Each direction
goes first by a fast path generated per record (``core.fastcodec``) that looks at each
value's exact type only, and takes the checked path for whatever it cannot vouch for: the
same bytes, commands and errors (tests/core/test_entry.py holds both to one reference).

Changing the format: a new command takes a new tag (never reuse or renumber one). Changing
the fields of an existing command, of SendEntry or of MessageAttributeValue changes the
layout: bump ENTRY_VERSION, and keep decoding the old version for as long as logs and
snapshots may hold it. tests/core/test_entry.py pins the tags, the field lists and one
encoding byte for byte.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import attrgetter, call
from types import MappingProxyType
from typing import Any, NamedTuple

import msgpack

from sqsq.core import commands as c
from sqsq.core.fastcodec import Slow, generate
from sqsq.core.frozen import quick_init
from sqsq.core.messages import MessageAttributeValue
from sqsq.core.redrive import CancelMoveTask, StartMoveTask

ENTRY_VERSION = 1

# What the machine applies: commands.Command, and the move-task commands that live in
# redrive (which imports commands, so commands.Command cannot name them).
Command = c.Command | StartMoveTask | CancelMoveTask


@quick_init
@dataclass(frozen=True)
class Entry:
    """One log entry: the leader's time and the commands applied at it, in order. An entry
    with no commands is a valid no-op (a barrier)."""

    now_ms: int
    commands: tuple[Command, ...]


# ---- field kinds: each checks one value and converts it to or from its wire form ---------

_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1  # what a msgpack int can carry


def _bad(expected: str, got: object) -> ValueError:
    return ValueError(f"expected {expected}, got {type(got).__name__} {got!r:.80}")


class _Kind(NamedTuple):
    enc: Callable[[Any], Any]  # dataclass value -> wire value (lists, tuples, scalars)
    dec: Callable[[Any], Any]  # wire value (arrays unpacked as tuples) -> dataclass value
    # The fast path (``core.fastcodec``): the exact types a value may have there,
    # the same both ways, and what converts a non-empty tuple of them each way (None: the
    # value is its own form, its type says all).
    types: tuple[type, ...] = ()
    fast_enc: Callable[[Any], Any] | None = None
    fast_dec: Callable[[Any], Any] | None = None


def _plain(check: Callable[[Any], Any], *types: type, tuples: bool = False) -> _Kind:
    """A kind whose wire form is the value itself: the same check serves both ways (and on
    the fast path too for a tuple's items, which their container's type does not vouch
    for)."""
    fast = check if tuples else None
    return _Kind(check, check, types, fast, fast)


def _str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise _bad("str", v)


def _int(v: Any) -> int:
    if type(v) is int and _INT_MIN <= v <= _INT_MAX:  # type(): a bool is not an int here
        return v
    raise _bad("a 64-bit int", v)


def _opt_str(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    raise _bad("str or None", v)


def _opt_int(v: Any) -> int | None:
    return None if v is None else _int(v)


def _opt_bytes(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    raise _bad("bytes or None", v)


def _strs(v: Any) -> tuple[str, ...]:
    if type(v) is not tuple:
        raise _bad("a tuple of str", v)
    for s in v:
        if not isinstance(s, str):
            raise _bad("str", s)
    return v


def _str_pairs(v: Any) -> tuple[tuple[str, str], ...]:
    if type(v) is not tuple:
        raise _bad("a tuple of (str, str)", v)
    for p in v:
        if type(p) is not tuple or len(p) != 2 or not isinstance(p[0], str) \
                or not isinstance(p[1], str):
            raise _bad("a (str, str)", p)
    return v


def _visibility_changes(v: Any) -> tuple[tuple[str, str, int], ...]:
    if type(v) is not tuple:
        raise _bad("a tuple of (entry id, receipt handle, timeout s)", v)
    for p in v:
        if type(p) is not tuple or len(p) != 3 or not isinstance(p[0], str) \
                or not isinstance(p[1], str):
            raise _bad("a (str, str, int)", p)
        _int(p[2])
    return v


_NONE = type(None)
_STR, _INT = _plain(_str, str), _plain(_int, int)
_OPT_STR, _OPT_INT = _plain(_opt_str, str, _NONE), _plain(_opt_int, int, _NONE)
_OPT_BYTES = _plain(_opt_bytes, bytes, _NONE)
_STRS, _STR_PAIRS, _VISIBILITY_CHANGES = (
    _plain(check, tuple, tuples=True) for check in (_strs, _str_pairs, _visibility_changes))


def _values_getter(names: tuple[str, ...]) -> Callable[[Any], tuple]:
    """One C call that returns a record's field values as a tuple, in order."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        get_one = attrgetter(names[0])
        return lambda obj: (get_one(obj),)
    return attrgetter(*names)


class _Record:
    """A dataclass as the array of its fields, in declaration order."""

    def __init__(self, cls: type, *fields: tuple[str, _Kind]) -> None:
        self.cls = cls
        self.fields = fields
        self.names = tuple(name for name, _ in fields)
        self._encs = tuple(kind.enc for _, kind in fields)
        self._decs = tuple(kind.dec for _, kind in fields)
        self._values = _values_getter(self.names)
        self.fast_enc = self.fast(encode=True)
        self.fast_dec = self.fast(encode=False)

    def enc(self, obj: Any) -> list:
        if type(obj) is not self.cls:
            raise _bad(self.cls.__name__, obj)
        values = self._values(obj)
        try:
            return list(map(call, self._encs, values))  # map(call): the loop runs in C
        except ValueError as e:
            raise self._blame(self._encs, values, e) from e

    def dec(self, wire: Any) -> Any:
        if type(wire) is not tuple or len(wire) != len(self.names):
            raise ValueError(f"expected {self.cls.__name__} as {len(self.names)} fields "
                             f"{list(self.names)}, got {wire!r:.80}")
        try:
            return self.cls(*map(call, self._decs, wire))
        except ValueError as e:
            raise self._blame(self._decs, wire, e) from e

    def fast(self, encode: bool, tag: int | None = None) -> Callable[[Any], Any]:
        kinds = [kind for _, kind in self.fields]
        return generate(self.cls, self._values, [kind.types for kind in kinds],
                        [kind.fast_enc if encode else kind.fast_dec for kind in kinds],
                        encode=encode, tag=tag)

    def kind(self) -> _Kind:
        """(As a tuple's item: a record is no field of its own.)"""
        return _Kind(self.enc, self.dec, (), self.fast_enc, self.fast_dec)

    def _blame(self, fns: tuple, values: tuple, err: ValueError) -> ValueError:
        """Which field failed (the error path only: the happy path does not track it)."""
        for name, fn, v in zip(self.names, fns, values, strict=True):
            try:
                fn(v)
            except ValueError as e:
                return ValueError(f"{self.cls.__name__}.{name}: {e}")
        return err


def _tuple_of(item: _Kind, what: str) -> _Kind:
    def enc(v: Any) -> list:
        if type(v) is not tuple:
            raise _bad(f"a tuple of {what}", v)
        return [item.enc(x) for x in v]

    def dec(v: Any) -> tuple:
        if type(v) is not tuple:
            raise _bad(f"a tuple of {what}", v)
        return tuple([item.dec(x) for x in v])

    item_enc, item_dec = item.fast_enc, item.fast_dec
    if item_enc is None or item_dec is None:
        raise ValueError(f"a tuple of {what}: its items need a fast form")

    def fast_enc(v: tuple) -> tuple:
        return tuple(map(item_enc, v))

    def fast_dec(v: tuple) -> tuple:
        return tuple(map(item_dec, v))

    return _Kind(enc, dec, (tuple,), fast_enc, fast_dec)


_ATTRIBUTE_VALUE = _Record(
    MessageAttributeValue,
    ("data_type", _STR), ("string_value", _OPT_STR), ("binary_value", _OPT_BYTES),
)


def _attribute_pairs(v: Any, convert: Callable[[Any], Any]) -> list:
    """Message attributes as (name, value) pairs, each value through ``convert``: the one
    check both directions share."""
    if type(v) is not tuple:
        raise _bad("a tuple of (name, MessageAttributeValue)", v)
    out = []
    for p in v:
        if type(p) is not tuple or len(p) != 2:
            raise _bad("a (name, MessageAttributeValue)", p)
        out.append((_str(p[0]), convert(p[1])))
    return out


def _enc_attributes(v: Any) -> list:
    return _attribute_pairs(v, _ATTRIBUTE_VALUE.enc)


def _dec_attributes(v: Any) -> tuple:
    return tuple(_attribute_pairs(v, _ATTRIBUTE_VALUE.dec))


_ATTRIBUTES = _Kind(
    _enc_attributes, _dec_attributes, (tuple,),
    lambda v: _attribute_pairs(v, _ATTRIBUTE_VALUE.fast_enc),
    lambda v: tuple(_attribute_pairs(v, _ATTRIBUTE_VALUE.fast_dec)))

_SEND_ENTRY = _Record(
    c.SendEntry,
    ("entry_id", _STR), ("body", _STR), ("delay_seconds", _OPT_INT),
    ("message_attributes", _ATTRIBUTES), ("message_group_id", _OPT_STR),
    ("message_deduplication_id", _OPT_STR), ("aws_trace_header", _OPT_STR),
)


# ---- the tag table: explicit and append-only --------------------------------------------

_COMMANDS: dict[int, _Record] = {
    1: _Record(c.CreateQueue, ("name", _STR), ("attributes", _STR_PAIRS), ("tags", _STR_PAIRS)),
    2: _Record(c.DeleteQueue, ("name", _STR)),
    3: _Record(c.SetQueueAttributes, ("name", _STR), ("attributes", _STR_PAIRS)),
    4: _Record(c.PurgeQueue, ("name", _STR)),
    5: _Record(c.TagQueue, ("name", _STR), ("tags", _STR_PAIRS)),
    6: _Record(c.UntagQueue, ("name", _STR), ("tag_keys", _STRS)),
    7: _Record(c.SendMessages, ("queue", _STR),
               ("entries", _tuple_of(_SEND_ENTRY.kind(), "SendEntry")),
               ("request_id", _STR), ("message_ids", _STRS)),
    8: _Record(c.ReceiveMessages, ("queue", _STR), ("max_number_of_messages", _INT),
               ("visibility_timeout_s", _OPT_INT), ("nonce", _INT),
               ("receive_request_attempt_id", _STR)),
    9: _Record(c.DeleteMessages, ("queue", _STR), ("entries", _STR_PAIRS)),
    10: _Record(c.ChangeVisibilities, ("queue", _STR), ("entries", _VISIBILITY_CHANGES)),
    11: _Record(c.Sweep),
    12: _Record(c.Configure, ("fingerprint", _STR)),
    13: _Record(StartMoveTask, ("source_arn", _STR), ("destination_arn", _OPT_STR),
                ("max_number_of_messages_per_second", _OPT_INT), ("task_handle", _STR)),
    14: _Record(CancelMoveTask, ("task_handle", _STR)),
}

# command type -> its tag
TAGS: Mapping[type, int] = MappingProxyType({rec.cls: tag for tag, rec in _COMMANDS.items()})
# every encoded type -> its fields as laid out on the wire, in order
FIELDS: Mapping[type, tuple[str, ...]] = MappingProxyType(
    {rec.cls: rec.names for rec in (*_COMMANDS.values(), _SEND_ENTRY, _ATTRIBUTE_VALUE)})
_BY_TYPE: dict[type, tuple[int, _Record]] = {rec.cls: (tag, rec) for tag, rec in
                                             _COMMANDS.items()}


# ---- the fast path (``core.fastcodec``) --------------------------------------------------

_FAST_ENCODE: dict[type, Callable[[Any], Any]] = {
    rec.cls: rec.fast(encode=True, tag=tag)
    for tag, rec in _COMMANDS.items()}
_FAST_DECODE: dict[int, Callable[[Any], Any]] = {
    tag: rec.fast(encode=False, tag=tag)
    for tag, rec in _COMMANDS.items()}


def _no_fast_path(_: Any) -> Any:
    raise Slow


def _fast_encode(cmd: Any) -> Any:
    return _FAST_ENCODE.get(type(cmd), _no_fast_path)(cmd)


def _fast_decode(wire: Any) -> Any:
    if type(wire) is not tuple or not wire or type(wire[0]) is not int:  # True == 1
        raise Slow
    return _FAST_DECODE.get(wire[0], _no_fast_path)(wire)


# ---- the entry ----------------------------------------------------------------------------

# One Packer for every entry, as in records.py: ``msgpack.packb`` builds a Packer per call.
# Sharing is safe: the wire form is plain lists, tuples, ints, strs, bytes and None, so a
# ``pack`` calls no Python code and runs to its end under the GIL; it resets after each, an
# error included. surrogatepass, both ways: every Python str round trips. The fast path
# packs and unpacks strict UTF-8 first (a third faster: no error handler to go through),
# which gives the same bytes for every str without a lone surrogate and refuses the others.
_PACKER = msgpack.Packer(use_bin_type=True, unicode_errors="surrogatepass")
_STRICT_PACKER = msgpack.Packer(use_bin_type=True)


def _check_now(now_ms: Any) -> int:
    if type(now_ms) is not int or not 0 <= now_ms <= _INT_MAX:
        raise ValueError(f"log entry: now_ms: {_bad('an int >= 0', now_ms)}")
    return now_ms


def _encode_command(cmd: Any) -> list:
    found = _BY_TYPE.get(type(cmd))
    if found is None:
        raise ValueError(f"log entry: {type(cmd).__name__} has no tag: it is not a command")
    tag, rec = found
    try:
        return [tag, *rec.enc(cmd)]
    except ValueError as e:
        raise ValueError(f"log entry: {e}") from e


def _decode_command(wire: Any) -> Any:
    if type(wire) is not tuple or not wire:
        raise ValueError(f"log entry: expected a command [tag, field, ...], got {wire!r:.80}")
    tag = wire[0]
    rec = _COMMANDS.get(tag) if type(tag) is int else None  # True == 1: check the type
    if rec is None:
        raise ValueError(f"log entry: unknown command tag {tag!r:.40} (version {ENTRY_VERSION}"
                         f" knows {min(_COMMANDS)}..{max(_COMMANDS)}); refusing to guess")
    try:
        return rec.dec(wire[1:])
    except ValueError as e:
        raise ValueError(f"log entry: {e}") from e


def encode_entry(entry: Entry) -> bytes:
    """``[ENTRY_VERSION, now_ms, [[tag, field, ...], ...]]`` as msgpack; ValueError if a value
    does not fit its declared type (it would not decode to an equal entry)."""
    commands, now_ms = entry.commands, entry.now_ms
    if type(commands) is tuple and type(now_ms) is int and now_ms >= 0:
        try:
            data = _STRICT_PACKER.pack(
                [ENTRY_VERSION, now_ms, [_fast_encode(cmd) for cmd in commands]])
        except (Slow, ValueError, OverflowError):
            pass  # the checked path decides
        else:
            if type(entry) is Entry and len(data) <= RECENT_MAX_BYTES:
                _remember(data, entry)
            return data
    return _encode_checked(entry)


# The entries this process encoded last, by their bytes: a leader applies each entry it
# proposed, and decoding what it has just encoded was a tenth of its apply (a few us per
# command). Only entries of the fast path are kept: every value has its exact declared type,
# so the entry is equal, field for field and type for type, to what decoding its bytes
# gives; a hit hands out the very objects encoded (frozen: nobody changes them). Bounded in
# count and in size: what a leader has proposed and not applied yet, a few entries. The event
# loop encodes while worker threads decode, so only operations that are one step under the
# GIL: a dict's set and pop, a deque's append and popleft (the oldest is found in the deque:
# iterating the dict while another thread pops from it raises). 128: a node leading many
# shards has up to ``proposer.MAX_IN_FLIGHT`` (4) entries out in each; at most 8 MiB.
RECENT_MAX = 128
RECENT_MAX_BYTES = 64 << 10
_recent: dict[bytes, Entry] = {}
_recent_order: deque[bytes] = deque()  # oldest first; may name entries decoded since


def _remember(data: bytes, entry: Entry) -> None:
    _recent[data] = entry
    order = _recent_order
    order.append(data)
    while len(order) > RECENT_MAX:
        try:
            _recent.pop(order.popleft(), None)
        except IndexError:  # another encoding thread took the last one
            break


def _encode_checked(entry: Entry) -> bytes:
    commands = entry.commands
    if type(commands) is not tuple:
        raise ValueError(f"log entry: commands: {_bad('a tuple', commands)}")
    return _PACKER.pack(
        [ENTRY_VERSION, _check_now(entry.now_ms), [_encode_command(cmd) for cmd in commands]])


def decode_entry(data: bytes) -> Entry:
    """The entry ``encode_entry`` wrote; ValueError for anything else (an unknown version or
    tag, a wrong shape, bytes that are not msgpack)."""
    if _recent and type(data) is bytes and len(data) <= RECENT_MAX_BYTES:
        entry = _recent.pop(data, None)
        if entry is not None:
            return entry
    try:
        wire = msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException):
        wire = _unpack_checked(data)  # a lone surrogate, or no msgpack value: it decides
    if type(wire) is not tuple or not wire:
        raise ValueError(f"log entry: expected [version, now_ms, commands], got {wire!r:.80}")
    version = wire[0]
    if type(version) is not int or version != ENTRY_VERSION:
        raise ValueError(f"log entry: unknown version {version!r:.40} (this replica reads "
                         f"version {ENTRY_VERSION}); refusing to guess")
    if len(wire) != 3 or type(wire[2]) is not tuple:
        raise ValueError(f"log entry: expected [version, now_ms, commands], got {wire!r:.80}")
    now_ms, commands = _check_now(wire[1]), wire[2]
    try:
        return Entry(now_ms, tuple(map(_fast_decode, commands)))
    except (Slow, ValueError):
        return Entry(now_ms, tuple([_decode_command(cmd) for cmd in commands]))


def _unpack_checked(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=True,
                               unicode_errors="surrogatepass")
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise ValueError(f"log entry: not a msgpack value: {e}") from e
