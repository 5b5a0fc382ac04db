"""The Raft wire codec: whatever the core sends comes out the same on the other node, and
whatever a peer sends that the codec would not have made is refused, never half-read."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqsq.raft.types import ConfState, Entry, EntryKind, Message, MsgType, SnapshotMeta
from sqsq.shard.raftwire import (
    FORMAT_VERSION,
    Chunk,
    decode_ack,
    decode_chunk,
    decode_messages,
    decode_write_sets,
    encode_ack,
    encode_chunk,
    encode_messages,
    encode_write_sets,
)

U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
IDS = st.text(min_size=1, max_size=20)
DATA = st.one_of(st.just(b""), st.binary(max_size=64),
                 st.integers(min_value=60_000, max_value=300_000).map(lambda n: b"x" * n))

entries = st.builds(Entry, index=U64, term=U64, data=DATA, kind=st.sampled_from(EntryKind))
confs = st.builds(ConfState, voters=st.frozensets(IDS, max_size=5),
                  learners=st.frozensets(IDS, max_size=3))
snapshots = st.builds(SnapshotMeta, index=U64, term=U64, conf=confs)
messages = st.builds(
    Message, type=st.sampled_from(MsgType), to=IDS, frm=IDS, term=U64, log_term=U64,
    index=U64, entries=st.lists(entries, max_size=4).map(tuple), commit=U64,
    reject=st.booleans(), hint=U64, snapshot=st.none() | snapshots,
    context=st.binary(max_size=32))
batches = st.lists(st.tuples(U64, messages), max_size=6)


@settings(max_examples=150, deadline=None)
@given(batches)
def test_every_batch_comes_back_as_it_was_sent(batch: list[tuple[int, Message]]) -> None:
    assert decode_messages(encode_messages(batch)) == batch


def test_every_message_type_round_trips() -> None:
    meta = SnapshotMeta(9, 2, ConfState(frozenset({"a", "b"}), frozenset({"c"})))
    batch = [(shard, Message(t, "b", "a", 3, snapshot=meta if t is MsgType.SNAPSHOT else None,
                             context=b"ctx"))
             for shard, t in enumerate(MsgType)]
    assert decode_messages(encode_messages(batch)) == batch


@given(st.builds(Chunk, transfer=U64, seq=st.integers(1, 1 << 40), last=st.booleans(),
                 shard=U64, index=U64, term=U64, data=DATA))
def test_chunks_and_acks_round_trip(chunk: Chunk) -> None:
    assert decode_chunk(encode_chunk(chunk)) == chunk
    assert decode_ack(encode_ack(chunk.transfer, chunk.last)) == (chunk.transfer, chunk.last)


def test_a_first_chunk_carries_its_snapshots_message() -> None:
    meta = SnapshotMeta(7, 3, ConfState(frozenset({"a"})))
    snap = Message(MsgType.SNAPSHOT, "b", "a", 3, snapshot=meta)
    first = Chunk(1, 0, False, 4, 7, 3, b"data", snap)
    assert decode_chunk(encode_chunk(first)) == first
    with pytest.raises(ValueError, match="first chunk"):
        decode_chunk(encode_chunk(Chunk(1, 0, False, 4, 7, 3, b"data")))
    with pytest.raises(ValueError, match="not that snapshot"):
        decode_chunk(encode_chunk(Chunk(1, 0, False, 4, 8, 3, b"data", snap)))


def _raw(message: list[object]) -> bytes:
    return msgpack.packb([FORMAT_VERSION, [[0, message]]], use_bin_type=True)


GOOD = [int(MsgType.APPEND), "b", "a", 1, 0, 0, [[1, 1, b"x", 0]], 0, False, 0, None, b""]


def _with(position: int, value: object) -> list[object]:
    bad = list(GOOD)
    bad[position] = value
    return bad


@pytest.mark.parametrize(("payload", "why"), [
    (b"\xc1", "not msgpack"),
    (b"", "not msgpack"),
    (msgpack.packb({"v": 1}), "versioned"),
    (msgpack.packb([FORMAT_VERSION + 1, []]), "format version"),
    (msgpack.packb([True, []]), "format version"),  # a bool is not the version 1
    (msgpack.packb([FORMAT_VERSION, [[0, GOOD]]]) + b"\x00", "not msgpack"),  # trailing
    (_raw(GOOD[:-1]), "12 fields"),
    (_raw(_with(0, 99)), "unknown value"),
    (_raw(_with(1, "")), "node id"),
    (_raw(_with(2, 5)), "node id"),
    (_raw(_with(3, -1)), "unsigned"),
    (_raw(_with(3, True)), "unsigned"),
    (_raw(_with(5, 1.5)), "unsigned"),
    (_raw(_with(6, [[1, 1, "text", 0]])), "bytes"),
    (_raw(_with(6, [[1, 1, b"x", 7]])), "unknown value"),
    (_raw(_with(6, [[1, 1, b"x"]])), "4 fields"),
    (_raw(_with(8, 0)), "boolean"),
    (_raw(_with(10, [1, 1, ["a"]])), "4 fields"),
    (_raw(_with(10, [1, 1, [7], []])), "node id"),
    (_raw(_with(11, None)), "bytes"),
    (msgpack.packb([FORMAT_VERSION, [[-1, GOOD]]], use_bin_type=True), "shard"),
    (msgpack.packb([FORMAT_VERSION, [[0, msgpack.ExtType(1, b"x")]]]), "array"),
])
def test_a_malformed_batch_is_refused_whole(payload: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        decode_messages(payload)


def test_the_good_shape_used_above_does_decode() -> None:
    """(So each refusal above is the one field's doing.)"""
    (shard, message), = decode_messages(_raw(GOOD))
    assert (shard, message.entries) == (0, (Entry(1, 1, b"x"),))


EDGE_VALUES = [None, True, False, -1, 0, 1, 7, 10, 11, (1 << 64) - 1, 1 << 64, 1.5, "", "a",
               "x" * 1025, b"", b"x", [], [[1, 1, b"x", 0]], [[1, 1, b"x", 9]], [[-1, 1, b"", 0]],
               [2, 1, ["a"], []], [2, 1, ["a"]], {"a": 1}]


def _quick_and_full_agree(fields: list[object]) -> None:
    from sqsq.shard import raftwire

    def outcome(decode: object) -> object:
        try:
            return decode(fields)  # type: ignore[operator]
        except ValueError:
            return ValueError

    assert outcome(raftwire._unpack_message) == outcome(  # noqa: SLF001
        raftwire._unpack_message_checked), fields  # noqa: SLF001


def test_the_quick_check_accepts_exactly_what_the_full_check_accepts() -> None:
    """Decoding checks the common case in one expression and falls back to the checks that
    name the bad field: both must agree on what is a message, for every field of a good
    one replaced by every odd value (and one field too many)."""
    for position in range(len(GOOD) + 1):
        for value in EDGE_VALUES:
            fields = list(GOOD)
            if position < len(GOOD):
                fields[position] = value
            else:
                fields.append(value)
            _quick_and_full_agree(fields)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.sampled_from(EDGE_VALUES)),
                min_size=2, max_size=3))
def test_the_quick_and_full_checks_agree_on_several_odd_fields(
        changes: list[tuple[int, object]]) -> None:
    fields = list(GOOD)
    for position, value in changes:
        fields[position] = value
    _quick_and_full_agree(fields)


def test_write_sets_round_trip_and_a_malformed_one_is_refused() -> None:
    sets = [(1, 10, 2, 77, b"\x81\xa1s\xc4\x00"), (1, 11, 2, 78, None)]
    assert decode_write_sets(encode_write_sets(sets)) == sets
    for bad in ([1, [[1, 10, 2, 7, "text"]]], [1, [[1, -1, 2, 7, None]]],
                [1, [[1, 10, 2, None]]], [1, [[1, 10, 2, -7, None]]], [2, []]):
        with pytest.raises(ValueError):
            decode_write_sets(msgpack.packb(bad, use_bin_type=True))
