"""The log entry format: every command round trips exactly; the layout is pinned."""

from __future__ import annotations

import dataclasses
import sys
import threading

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqsq.core import commands as c
from sqsq.core import entry as entry_module
from sqsq.core import machine, redrive
from sqsq.core.entry import (
    ENTRY_VERSION,
    FIELDS,
    TAGS,
    Entry,
    decode_entry,
    encode_entry,
)
from sqsq.core.messages import MessageAttributeValue as V

REMEMBER = entry_module._remember


@pytest.fixture(autouse=True)
def _decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The round trips here test decoding: the process's memo of the entries it encoded
    (which a decode of the same bytes would hand back) is off, but for ``memo``."""
    monkeypatch.setattr(entry_module, "_remember", lambda data, entry: None)


@pytest.fixture
def memo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entry_module, "_remember", REMEMBER)
    entry_module._recent.clear()
    entry_module._recent_order.clear()


# ---- strategies: valid-shaped commands, not necessarily valid requests -------------------

# Any str, lone surrogates included: the state machine, not the codec, judges content.
odd_chars = st.sampled_from("\ud800\udfff\x00\u00e9\U0001f600")
text = st.text(st.characters(exclude_categories=()) | odd_chars, max_size=20)
opt_text = st.none() | text
i64 = st.integers(-(2**63), 2**64 - 1)  # what a msgpack int holds
opt_i64 = st.none() | i64


def tuples(elements: st.SearchStrategy, max_size: int = 4) -> st.SearchStrategy:
    return st.lists(elements, max_size=max_size).map(tuple)


pairs = tuples(st.tuples(text, text))
attribute_values = st.one_of(
    st.builds(V, text, st.none(), st.binary(max_size=16)),  # Binary
    st.builds(V, text, text, st.none()),  # String / Number
    st.builds(V, text, opt_text, st.none() | st.binary(max_size=4)),  # any shape
)
send_entries = st.builds(
    c.SendEntry, text, text, opt_i64, tuples(st.tuples(text, attribute_values)),
    opt_text, opt_text, opt_text,
)

COMMANDS: dict[type, st.SearchStrategy] = {
    c.CreateQueue: st.builds(c.CreateQueue, text, pairs, pairs),
    c.DeleteQueue: st.builds(c.DeleteQueue, text),
    c.SetQueueAttributes: st.builds(c.SetQueueAttributes, text, pairs),
    c.PurgeQueue: st.builds(c.PurgeQueue, text),
    c.TagQueue: st.builds(c.TagQueue, text, pairs),
    c.UntagQueue: st.builds(c.UntagQueue, text, tuples(text)),
    c.SendMessages: st.builds(c.SendMessages, text, tuples(send_entries, 3), text,
                              tuples(text)),
    c.ReceiveMessages: st.builds(c.ReceiveMessages, text, i64, opt_i64, i64, text),
    c.DeleteMessages: st.builds(c.DeleteMessages, text, pairs),
    c.ChangeVisibilities: st.builds(c.ChangeVisibilities, text,
                                    tuples(st.tuples(text, text, i64))),
    c.Sweep: st.just(c.Sweep()),
    c.Configure: st.builds(c.Configure, text),
    redrive.StartMoveTask: st.builds(redrive.StartMoveTask, text, opt_text, opt_i64, text),
    redrive.CancelMoveTask: st.builds(redrive.CancelMoveTask, text),
}
any_command = st.one_of(*COMMANDS.values())
entries = st.builds(Entry, st.integers(0, 2**64 - 1), tuples(any_command, 6))


@settings(max_examples=300, deadline=None)
@given(entries)
def test_every_entry_round_trips_exactly(entry: Entry) -> None:
    data = encode_entry(entry)
    assert decode_entry(data) == entry
    assert encode_entry(decode_entry(data)) == data  # one entry, one encoding


@pytest.mark.parametrize("cls", list(COMMANDS), ids=lambda cls: cls.__name__)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_each_command_round_trips(cls: type, data: st.DataObject) -> None:
    command = data.draw(COMMANDS[cls])
    assert decode_entry(encode_entry(Entry(5, (command,)))).commands == (command,)


def reference(entry: Entry) -> bytes:
    """The format as its docstring states it, written out naively: every record the array
    of its fields in FIELDS' order, every tuple an array."""
    def wire(v: object) -> object:
        if type(v) in FIELDS:
            return [wire(getattr(v, name)) for name in FIELDS[type(v)]]
        return [wire(x) for x in v] if isinstance(v, tuple) else v

    return msgpack.packb([ENTRY_VERSION, entry.now_ms,
                          [[TAGS[type(cmd)], *wire(cmd)] for cmd in entry.commands]],  # type: ignore[misc]
                         use_bin_type=True, unicode_errors="surrogatepass")


@settings(max_examples=300, deadline=None)
@given(entries)
def test_the_encoding_is_the_stated_format(entry: Entry) -> None:
    """Whichever way the codec goes (its fast path, or the checked one for what the fast
    path cannot vouch for), the bytes are the format and decode to the entry."""
    data = reference(entry)
    assert encode_entry(entry) == data
    assert decode_entry(data) == entry


class Name(str):
    """A str the fast path does not take on its type: the checked path encodes it."""


def test_a_str_subclass_is_encoded_as_its_str() -> None:
    odd = Entry(5, (c.DeleteMessages(Name("q"), ((Name("e"), "h"),)),
                    c.SendMessages("q", (c.SendEntry(Name("e"), "b"),), "", ("id",))))
    plain = Entry(5, (c.DeleteMessages("q", (("e", "h"),)),
                      c.SendMessages("q", (c.SendEntry("e", "b"),), "", ("id",))))
    assert encode_entry(odd) == encode_entry(plain) == reference(plain)
    assert type(decode_entry(encode_entry(odd)).commands[0].queue) is str


def test_the_empty_entry_is_a_barrier() -> None:
    assert decode_entry(encode_entry(Entry(0, ()))) == Entry(0, ())


def test_bytes_str_and_tuples_keep_their_types() -> None:
    value = V("Binary.x", None, b"\x00\xff")
    send = c.SendMessages("q", (c.SendEntry("e", "\ud800 b\u00e9", None, (("a", value),)),))
    decoded = decode_entry(encode_entry(Entry(1, (send,)))).commands[0]
    assert decoded == send
    entry = decoded.entries[0]
    assert type(entry.message_attributes) is tuple
    assert type(entry.message_attributes[0]) is tuple
    assert type(entry.message_attributes[0][1].binary_value) is bytes
    assert entry.body == "\ud800 b\u00e9"


# ---- the table -------------------------------------------------------------------------


def test_every_command_the_machine_applies_has_a_tag_and_a_strategy() -> None:
    assert set(TAGS) == set(machine.HANDLERS)
    assert set(COMMANDS) == set(machine.HANDLERS)
    assert len(set(TAGS.values())) == len(TAGS)


def test_tags_are_stable() -> None:
    """Append-only: a tag in a written log means one command forever."""
    assert {cls.__name__: tag for cls, tag in TAGS.items()} == {
        "CreateQueue": 1, "DeleteQueue": 2, "SetQueueAttributes": 3, "PurgeQueue": 4,
        "TagQueue": 5, "UntagQueue": 6, "SendMessages": 7, "ReceiveMessages": 8,
        "DeleteMessages": 9, "ChangeVisibilities": 10, "Sweep": 11, "Configure": 12,
        "StartMoveTask": 13, "CancelMoveTask": 14,
    }


def test_the_layout_lists_every_field_in_declaration_order() -> None:
    """A field added to a command (or reordered) must change the codec and the version."""
    assert set(FIELDS) == set(machine.HANDLERS) | {c.SendEntry, V}
    for cls, names in FIELDS.items():
        assert names == tuple(f.name for f in dataclasses.fields(cls)), cls.__name__


# ---- refusals ----------------------------------------------------------------------------


def raw(*items: object) -> bytes:
    return msgpack.packb(list(items), use_bin_type=True)


def test_an_unknown_version_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown version 2"):
        decode_entry(raw(2, 0, []))
    with pytest.raises(ValueError, match="unknown version 2"):  # whatever follows it
        decode_entry(raw(2, 0, [], "more"))
    with pytest.raises(ValueError, match="unknown version True"):
        decode_entry(raw(True, 0, []))


def test_an_unknown_tag_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown command tag 99"):
        decode_entry(raw(ENTRY_VERSION, 0, [[99, "x"]]))
    with pytest.raises(ValueError, match="unknown command tag 0"):
        decode_entry(raw(ENTRY_VERSION, 0, [[11], [0]]))
    with pytest.raises(ValueError, match="unknown command tag 'Sweep'"):
        decode_entry(raw(ENTRY_VERSION, 0, [["Sweep"]]))


@pytest.mark.parametrize("data, message", [
    (b"", "not a msgpack value"),
    (b"\xc1", "not a msgpack value"),
    (raw(ENTRY_VERSION, 0, []) + b"\x00", "not a msgpack value"),
    (raw(ENTRY_VERSION, 0, [])[:-1], "not a msgpack value"),
    (msgpack.packb({"v": 1}), r"expected \[version, now_ms, commands\]"),
    (raw(ENTRY_VERSION, 0), r"expected \[version, now_ms, commands\]"),
    (raw(ENTRY_VERSION, -1, []), "now_ms"),
    (raw(ENTRY_VERSION, 0, [[]]), "expected a command"),
    (raw(ENTRY_VERSION, 0, [[2]]), "DeleteQueue as 1 fields"),
    (raw(ENTRY_VERSION, 0, [[2, "q", "extra"]]), "DeleteQueue as 1 fields"),
    (raw(ENTRY_VERSION, 0, [[2, b"q"]]), "DeleteQueue.name: expected str, got bytes"),
    (raw(ENTRY_VERSION, 0, [[8, "q", True, None, 0, ""]]),
     "ReceiveMessages.max_number_of_messages"),
    (raw(ENTRY_VERSION, 0, [[9, "q", [["e", "h", "x"]]]]), "DeleteMessages.entries"),
    (raw(ENTRY_VERSION, 0, [[7, "q", [["e", "b", None, [["a", ["Binary", None, "s"]]],
                                       None, None, None]], "", []]]),
     "SendEntry.message_attributes: MessageAttributeValue.binary_value: expected bytes"),
])
def test_malformed_entries_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_entry(data)


@pytest.mark.parametrize("entry, message", [
    (Entry(0, [c.Sweep()]), "commands: expected a tuple"),  # type: ignore[arg-type]
    (Entry(-1, ()), "now_ms"),
    (Entry(True, ()), "now_ms"),
    (Entry(0, (c.Outcome(c.Ok()),)), "Outcome has no tag"),  # type: ignore[arg-type]
    (Entry(0, (c.UntagQueue("q", ["k"]),)), "UntagQueue.tag_keys"),  # type: ignore[arg-type]
    (Entry(0, (c.ReceiveMessages("q", 2**64),)), "ReceiveMessages.max_number_of_messages"),
    (Entry(0, (c.ReceiveMessages("q", 1, False),)), "ReceiveMessages.visibility_timeout_s"),
    (Entry(0, (c.SendMessages("q", (c.SendEntry("e", "b", None, (("a", V("B", None, "s")),)),
                                    )),)),
     "SendMessages.entries: SendEntry.message_attributes: MessageAttributeValue.binary_value"),
])
def test_what_would_not_round_trip_is_not_encoded(entry: Entry, message: str) -> None:
    """The leader must never propose an entry its replicas would refuse."""
    with pytest.raises(ValueError, match=message):
        encode_entry(entry)


# ---- the layout, byte for byte -----------------------------------------------------------

GOLDEN_ENTRY = Entry(1_700_000_000_123, (
    c.CreateQueue("q.fifo", (("FifoQueue", "true"),), ()),
    c.SendMessages("q.fifo", (
        c.SendEntry("e1", "h\u00e9llo", None,
                    (("b", V("Binary", None, b"\x00\xff")), ("s", V("String", "v"))), "g"),
    ), "req-1", ("id-1",)),
    c.ChangeVisibilities("q.fifo", (("e1", "rh", 30),)),
    c.Sweep(),
    redrive.StartMoveTask("arn:dlq", None, 10, "th"),
))
GOLDEN_BYTES = (
    b"\x93\x01\xcf\x00\x00\x01\x8b\xcf\xe5\x68\x7b\x95"  # [version 1, now_ms, 5 commands:
    b"\x94\x01\xa6q.fifo\x91\x92\xa9FifoQueue\xa4true\x90"  # CreateQueue
    b"\x95\x07\xa6q.fifo\x91"  # SendMessages: queue, one entry:
    b"\x97\xa2e1\xa6h\xc3\xa9llo\xc0"  # id, body (UTF-8), delay None,
    b"\x92\x92\xa1b\x93\xa6Binary\xc0\xc4\x02\x00\xff"  # attributes: bytes as bin,
    b"\x92\xa1s\x93\xa6String\xa1v\xc0"  # strings as str,
    b"\xa1g\xc0\xc0"  # group, dedup None, trace None;
    b"\xa5req-1\x91\xa4id-1"  # request id, message ids
    b"\x93\x0a\xa6q.fifo\x91\x93\xa2e1\xa2rh\x1e"  # ChangeVisibilities
    b"\x91\x0b"  # Sweep
    b"\x95\x0d\xa7arn:dlq\xc0\x0a\xa2th"  # StartMoveTask]
)


def test_the_encoding_is_stable() -> None:
    """A different layout breaks every log already written: bump ENTRY_VERSION instead."""
    assert encode_entry(GOLDEN_ENTRY) == GOLDEN_BYTES
    assert decode_entry(GOLDEN_BYTES) == GOLDEN_ENTRY


def test_a_process_decodes_what_it_just_encoded_from_memory_bounded(memo: None) -> None:
    """A leader applies the entries it proposed: decoding one of them hands back the entry
    encoded (equal to what its bytes decode to), once; what is kept is bounded."""
    module = entry_module
    e = Entry(5, (c.SendMessages("q", (c.SendEntry("1", "body"),), "r", ("id",)),))
    data = encode_entry(e)
    assert decode_entry(data) is e
    assert decode_entry(data) == e and decode_entry(data) is not e  # taken: decoded now
    assert decode_entry(bytearray(encode_entry(e))) == e  # any bytes-like input still decodes
    for n in range(module.RECENT_MAX + 10):
        encode_entry(Entry(n, (c.Configure(str(n)),)))
    assert len(module._recent) == module.RECENT_MAX
    assert decode_entry(encode_entry(Entry(1, (c.Configure("1"),)))) == \
        Entry(1, (c.Configure("1"),))
    module._recent.clear()


def test_only_an_entry_of_exact_types_is_handed_back_as_encoded(memo: None) -> None:
    """A str subclass encodes (the checked path) and decodes as a plain str: what a replica
    that decodes the bytes gets, so the leader gets that too."""
    module = entry_module

    class Name(str):
        pass

    e = Entry(5, (c.Configure(Name("fp")),))
    got = decode_entry(encode_entry(e))
    assert got == e and type(got.commands[0].fingerprint) is str
    big = Entry(5, (c.Configure("x" * (module.RECENT_MAX_BYTES + 1)),))
    encode_entry(big)
    assert not module._recent  # too large to keep


def test_encoding_on_one_thread_while_others_decode_raises_nothing(memo: None) -> None:
    """A leader's event loop encodes while its worker threads decode: the memo's eviction
    must not iterate what another thread changes (it raised "dictionary changed size during
    iteration" that way). Thread switches forced as often as the interpreter allows."""
    errors: list[BaseException] = []
    encoded: list[bytes] = []
    done = threading.Event()

    def encode() -> None:
        try:
            for n in range(50_000):
                encoded.append(encode_entry(Entry(n, (c.Configure(str(n)),))))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            done.set()

    def decode() -> None:
        try:
            while not done.is_set():
                if encoded:
                    decode_entry(encoded[-1])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=f) for f in (encode, decode, decode)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
