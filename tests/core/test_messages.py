import hashlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqsq.core.messages import (
    MessageAttributeValue,
    check_message,
    content_deduplication_id,
    md5_of_body,
    md5_of_message_attributes,
    message_size,
    validate_batch_entry_ids,
    validate_body,
    validate_fifo_id,
    validate_message_attributes,
)
from sqsq.errors import ErrorCode, Rejection

S = MessageAttributeValue


def code(result: object) -> ErrorCode:
    assert isinstance(result, Rejection), result
    return result.code


# --- body --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    ["x", "hello world", "\t\n\r", "\u0020", "\ud7ff", "\ue000", "\ufffd", "😀", "\U0010ffff"],
)
def test_valid_bodies(body: str) -> None:
    assert validate_body(body) is None


def test_empty_body_is_missing() -> None:
    assert code(validate_body("")) is ErrorCode.MISSING_PARAMETER


@pytest.mark.parametrize("body", ["\x00", "a\x1fb", "\x0b", "\ufffe", "\uffff", "x\ud800"])
def test_invalid_body_characters(body: str) -> None:
    assert code(validate_body(body)) is ErrorCode.INVALID_MESSAGE_CONTENTS


# --- message attributes ------------------------------------------------------------------


def test_valid_attributes() -> None:
    attrs = {
        "s": S("String", "v"),
        "n": S("Number", "-1.5e3"),
        "b": S("Binary", binary_value=b"\x00\xff"),
        "a.b-c_d": S("String.custom", "😀"),
        "x" * 256: S("Number.int", "12"),
    }
    assert validate_message_attributes(attrs) is None
    assert validate_message_attributes({}) is None


def test_attribute_count_limit() -> None:
    ten = {f"a{i}": S("String", "v") for i in range(10)}
    assert validate_message_attributes(ten) is None
    eleven = {**ten, "a10": S("String", "v")}
    assert code(validate_message_attributes(eleven)) is ErrorCode.INVALID_PARAMETER_VALUE


@pytest.mark.parametrize(
    "name",
    [
        "",
        "x" * 257,
        "a b",
        "a/b",
        "a€b",  # a symbol, not a letter or digit
        "AWS.x",
        "aws.x",
        "Amazon.x",
        "AMAZON.x",
        ".a",
        "a.",
        "a..b",
    ],
)
def test_bad_attribute_names(name: str) -> None:
    rej = validate_message_attributes({name: S("String", "v")})
    assert code(rej) is ErrorCode.INVALID_PARAMETER_VALUE


def test_attribute_names_may_use_any_unicode_letter_or_digit() -> None:
    """As Amazon accepts: letters and digits of any script, besides _ - ."""
    for name in ("é", "名前", "Zähler_2", "٣-x.y"):
        assert validate_message_attributes({name: S("String", "v")}) is None, name


def test_names_merely_containing_reserved_words_are_fine() -> None:
    assert validate_message_attributes({"AWSx": S("String", "v")}) is None
    assert validate_message_attributes({"my.AWS.x": S("String", "v")}) is None


@pytest.mark.parametrize(
    "value",
    [
        S("", "v"),
        S("string", "v"),
        S("Str", "v"),
        S("StringX", "v"),
        S("String.", "v"),
        S("String." + "x" * 250, "v"),
        S("String", None),
        S("String", ""),
        S("Number", ""),
        S("Binary", None, None),
        S("Binary", None, b""),
        S("Binary", "v", b"x"),
        S("String", None, b"x"),
        S("String", "a\x00"),
        S("String", "\ufffe"),
        S("Number", "abc"),
        S("Number", "1e"),
        S("Number", "--1"),
        S("Number", "NaN"),
        S("Number", "Infinity"),
        S("Number", "1" * 39),
        S("Number", "1e127"),
        S("Number", "1e-129"),
        S("Number", " 1"),
    ],
)
def test_bad_attribute_values(value: MessageAttributeValue) -> None:
    assert code(validate_message_attributes({"a": value})) is ErrorCode.INVALID_PARAMETER_VALUE


@pytest.mark.parametrize(
    "number", ["0", "-0", "+7", "1.", ".5", "1E5", "1" * 38, "1" * 38 + "000", "1e126", "1e-128"]
)
def test_good_numbers(number: str) -> None:
    assert validate_message_attributes({"a": S("Number", number)}) is None


# --- size --------------------------------------------------------------------------------


def test_message_size_counts_body_and_attributes() -> None:
    assert message_size("héllo", {}) == 6
    attrs = {
        "name": S("String", "é"),  # 4 + 6 + 2
        "bin": S("Binary", binary_value=b"abc"),  # 3 + 6 + 3
        "n": S("Number.x", "10"),  # 1 + 8 + 2
    }
    assert message_size("ab", attrs) == 2 + 12 + 12 + 11


def test_check_message_size_boundary() -> None:
    attrs = {"k": S("String", "v")}  # 1 + 6 + 1 = 8 bytes
    body = "x" * (1024 - 8)
    assert check_message(body, attrs, 1024) is None
    rej = check_message(body + "x", attrs, 1024)
    assert code(rej) is ErrorCode.INVALID_PARAMETER_VALUE
    assert isinstance(rej, Rejection) and "1024 bytes" in rej.message
    # Multi-byte characters count as their UTF-8 length.
    assert check_message("😀" * 256, {}, 1024) is None
    assert code(check_message("😀" * 256 + "x", {}, 1024)) is ErrorCode.INVALID_PARAMETER_VALUE


def test_check_message_runs_content_rules_first() -> None:
    assert code(check_message("", {}, 1024)) is ErrorCode.MISSING_PARAMETER
    assert code(check_message("\x00", {}, 1024)) is ErrorCode.INVALID_MESSAGE_CONTENTS
    bad_attr = {"AWS.x": S("String", "v")}
    assert code(check_message("ok", bad_attr, 1024)) is ErrorCode.INVALID_PARAMETER_VALUE


# --- digests -----------------------------------------------------------------------------


def test_md5_of_body_known_answer() -> None:
    assert md5_of_body("hello") == "5d41402abc4b2a76b9719d911017c592"
    assert md5_of_body("😀") == hashlib.md5("😀".encode()).hexdigest()


@pytest.mark.parametrize("size", [0, 1, 2047, 2048, 2049, 70_000])
def test_md5_of_body_is_openssls_on_either_side_of_the_short_body_path(size: int) -> None:
    body = ("ab😀" * size)[:size]
    assert md5_of_body(body) == hashlib.md5(body.encode()).hexdigest()


def test_md5_of_message_attributes_known_answer() -> None:
    # Published value (LocalStack's test against the SDK's check) for one Number attribute.
    attrs = {"timestamp": S("Number", "1493147359900")}
    assert md5_of_message_attributes(attrs) == "235c5c510d26fb653d073faed50ae77c"


def test_md5_of_message_attributes_none_when_empty() -> None:
    assert md5_of_message_attributes({}) is None


def _reference_md5(attrs: dict[str, MessageAttributeValue]) -> str:
    """An independent spelling of the SDK's algorithm, used to check the implementation."""
    buf = b""
    for name in sorted(attrs):
        v = attrs[name]
        for part in (name.encode(), v.data_type.encode()):
            buf += len(part).to_bytes(4, "big") + part
        if v.data_type.startswith("Binary"):
            data = v.binary_value or b""
            buf += b"\x02"
        else:
            data = (v.string_value or "").encode()
            buf += b"\x01"
        buf += len(data).to_bytes(4, "big") + data
    return hashlib.md5(buf).hexdigest()


def test_md5_of_message_attributes_mixed_types_order_independent() -> None:
    attrs = {
        "zeta": S("String", "é😀"),
        "alpha": S("Binary.img", binary_value=b"\x00\x01\x02"),
        "Mid": S("Number", "3.14"),
    }
    expected = _reference_md5(attrs)
    assert md5_of_message_attributes(attrs) == expected
    reversed_attrs = dict(reversed(list(attrs.items())))
    assert md5_of_message_attributes(reversed_attrs) == expected


_names = st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)
_values = st.one_of(
    st.builds(lambda s: S("String", s), st.text(min_size=1, max_size=20)),
    st.builds(lambda b: S("Binary", binary_value=b), st.binary(min_size=1, max_size=20)),
)


@settings(deadline=None)  # a loaded CI machine must not turn a slow example into a failure
@given(st.dictionaries(_names, _values, min_size=1, max_size=10))
def test_md5_matches_reference(attrs: dict[str, MessageAttributeValue]) -> None:
    assert md5_of_message_attributes(attrs) == _reference_md5(attrs)


def test_content_deduplication_id() -> None:
    assert content_deduplication_id("hello") == (
        "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    )


# --- batch ids and FIFO ids --------------------------------------------------------------


def test_batch_entry_ids() -> None:
    assert validate_batch_entry_ids(["a", "B-1", "c_2", "x" * 80]) is None
    assert validate_batch_entry_ids([str(i) for i in range(10)]) is None
    assert code(validate_batch_entry_ids([])) is ErrorCode.EMPTY_BATCH_REQUEST
    eleven = [str(i) for i in range(11)]
    assert code(validate_batch_entry_ids(eleven)) is ErrorCode.TOO_MANY_ENTRIES_IN_BATCH_REQUEST
    for bad in ("", "x" * 81, "a b", "a.b", "é"):
        assert code(validate_batch_entry_ids(["ok", bad])) is ErrorCode.INVALID_BATCH_ENTRY_ID
    assert code(validate_batch_entry_ids(["a", "b", "a"])) is ErrorCode.BATCH_ENTRY_IDS_NOT_DISTINCT
    # an id may not hide a comma (the ids are matched joined by commas)
    for bad in (["a,b"], ["a,", "b"], [",a"], ["a", ",", "b"]):
        assert code(validate_batch_entry_ids(bad)) is ErrorCode.INVALID_BATCH_ENTRY_ID


def _first_broken_rule(ids: list[str]) -> ErrorCode | None:
    """The rules one id at a time, in the batch's order (the reference)."""
    if not ids:
        return ErrorCode.EMPTY_BATCH_REQUEST
    if len(ids) > 10:
        return ErrorCode.TOO_MANY_ENTRIES_IN_BATCH_REQUEST
    seen: set[str] = set()
    for i in ids:
        if not re.fullmatch("[A-Za-z0-9_-]{1,80}", i, re.ASCII):
            return ErrorCode.INVALID_BATCH_ENTRY_ID
        if i in seen:
            return ErrorCode.BATCH_ENTRY_IDS_NOT_DISTINCT
        seen.add(i)
    return None


@settings(max_examples=500)
@given(st.lists(st.sampled_from(["a", "b", "B-1", "c_2", "a,b", "b,", ",", "", "a b", "\u00e9",
                                 "a\n", "x" * 80, "y" * 81]), max_size=12))
def test_batch_entry_ids_break_the_first_rule_in_order(ids: list[str]) -> None:
    rej = validate_batch_entry_ids(ids)
    assert (None if rej is None else rej.code) is _first_broken_rule(ids)


@pytest.mark.parametrize("value", ["a", "x" * 128, "A-z_0.9", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"])
def test_valid_fifo_ids(value: str) -> None:
    assert validate_fifo_id(value, "MessageGroupId") is None


@pytest.mark.parametrize("value", ["", "x" * 129, "a b", "é", "a\tb", "😀"])
def test_invalid_fifo_ids(value: str) -> None:
    rej = validate_fifo_id(value, "MessageDeduplicationId")
    assert code(rej) is ErrorCode.INVALID_PARAMETER_VALUE
    assert isinstance(rej, Rejection) and "MessageDeduplicationId" in rej.message
