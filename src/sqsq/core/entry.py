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

Both directions check every value against the command's declared field types
(``core.entryfields``), so the leader cannot propose an entry its replicas would refuse, and
``decode_entry(encode_entry(e)) == e`` for every entry ``encode_entry`` accepts. Ints must fit
msgpack's 64 bits. Each direction goes first by a fast path generated per record
(``core.fastcodec``) that looks at each value's exact type only, and takes the checked path
for whatever it cannot vouch for: the same bytes, commands and errors (tests/core/test_entry.py
holds both to one reference).

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
from types import MappingProxyType
from typing import Any

import msgpack

from sqsq.core import commands as c
from sqsq.core.entryfields import (
    INT,
    INT_MAX,
    OPT_BYTES,
    OPT_INT,
    OPT_STR,
    STR,
    STR_PAIRS,
    STRS,
    VISIBILITY_CHANGES,
    Kind,
    Record,
    bad,
    check_str,
    tuple_of,
)
from sqsq.core.fastcodec import Slow
from sqsq.core.messages import MessageAttributeValue
from sqsq.core.redrive import CancelMoveTask, StartMoveTask
from sqsq.frozen import quick_init

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


_ATTRIBUTE_VALUE = Record(
    MessageAttributeValue,
    ("data_type", STR), ("string_value", OPT_STR), ("binary_value", OPT_BYTES),
)


def _attribute_pairs(v: Any, convert: Callable[[Any], Any]) -> list:
    """Message attributes as (name, value) pairs, each value through ``convert``: the one
    check both directions share."""
    if type(v) is not tuple:
        raise bad("a tuple of (name, MessageAttributeValue)", v)
    out = []
    for p in v:
        if type(p) is not tuple or len(p) != 2:
            raise bad("a (name, MessageAttributeValue)", p)
        out.append((check_str(p[0]), convert(p[1])))
    return out


def _enc_attributes(v: Any) -> list:
    return _attribute_pairs(v, _ATTRIBUTE_VALUE.enc)


def _dec_attributes(v: Any) -> tuple:
    return tuple(_attribute_pairs(v, _ATTRIBUTE_VALUE.dec))


_ATTRIBUTES = Kind(
    _enc_attributes, _dec_attributes, (tuple,),
    lambda v: _attribute_pairs(v, _ATTRIBUTE_VALUE.fast_enc),
    lambda v: tuple(_attribute_pairs(v, _ATTRIBUTE_VALUE.fast_dec)))

_SEND_ENTRY = Record(
    c.SendEntry,
    ("entry_id", STR), ("body", STR), ("delay_seconds", OPT_INT),
    ("message_attributes", _ATTRIBUTES), ("message_group_id", OPT_STR),
    ("message_deduplication_id", OPT_STR), ("aws_trace_header", OPT_STR),
)


# ---- the tag table: explicit and append-only --------------------------------------------

_COMMANDS: dict[int, Record] = {
    1: Record(c.CreateQueue, ("name", STR), ("attributes", STR_PAIRS), ("tags", STR_PAIRS)),
    2: Record(c.DeleteQueue, ("name", STR)),
    3: Record(c.SetQueueAttributes, ("name", STR), ("attributes", STR_PAIRS)),
    4: Record(c.PurgeQueue, ("name", STR)),
    5: Record(c.TagQueue, ("name", STR), ("tags", STR_PAIRS)),
    6: Record(c.UntagQueue, ("name", STR), ("tag_keys", STRS)),
    7: Record(c.SendMessages, ("queue", STR),
               ("entries", tuple_of(_SEND_ENTRY.kind(), "SendEntry")),
               ("request_id", STR), ("message_ids", STRS)),
    8: Record(c.ReceiveMessages, ("queue", STR), ("max_number_of_messages", INT),
               ("visibility_timeout_s", OPT_INT), ("nonce", INT),
               ("receive_request_attempt_id", STR)),
    9: Record(c.DeleteMessages, ("queue", STR), ("entries", STR_PAIRS)),
    10: Record(c.ChangeVisibilities, ("queue", STR), ("entries", VISIBILITY_CHANGES)),
    11: Record(c.Sweep),
    12: Record(c.Configure, ("fingerprint", STR)),
    13: Record(StartMoveTask, ("source_arn", STR), ("destination_arn", OPT_STR),
                ("max_number_of_messages_per_second", OPT_INT), ("task_handle", STR)),
    14: Record(CancelMoveTask, ("task_handle", STR)),
}

# command type -> its tag
TAGS: Mapping[type, int] = MappingProxyType({rec.cls: tag for tag, rec in _COMMANDS.items()})
# every encoded type -> its fields as laid out on the wire, in order
FIELDS: Mapping[type, tuple[str, ...]] = MappingProxyType(
    {rec.cls: rec.names for rec in (*_COMMANDS.values(), _SEND_ENTRY, _ATTRIBUTE_VALUE)})
_BY_TYPE: dict[type, tuple[int, Record]] = {rec.cls: (tag, rec) for tag, rec in
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
    if type(now_ms) is not int or not 0 <= now_ms <= INT_MAX:
        raise ValueError(f"log entry: now_ms: {bad('an int >= 0', now_ms)}")
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
        raise ValueError(f"log entry: commands: {bad('a tuple', commands)}")
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
