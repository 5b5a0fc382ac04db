"""Message content rules (body, message attributes, batch ids, FIFO ids) and SQS's digests.

Pure: no I/O, no clock. Failures are returned as ``Rejection`` values.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from sqsq.core import limits
from sqsq.errors import ErrorCode, Rejection, reject
from sqsq.frozen import quick_init

_BASE_TYPES = ("String", "Number", "Binary")
# SQS's Number: up to 38 significant digits, magnitude between 10^-128 and 10^126.
_NUMBER_MAX_DIGITS = 38
_NUMBER_MAX = Decimal("1e126")
_NUMBER_MIN = Decimal("1e-128")

# The XML 1.0 character set SQS allows in bodies and string values.
_INVALID_CHAR_RE = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_INVALID_CHARS_MESSAGE = (
    "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | "
    "#x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF"
)
# re.ASCII: \w and \d would otherwise accept non-ASCII letters and digits.
_ATTR_NAME_RE = re.compile(r"[\w.-]+")  # any Unicode letter or digit, _ . - (as SQS)
_NUMBER_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
_BATCH_ID = f"[A-Za-z0-9_-]{{1,{limits.BATCH_ENTRY_ID_MAX_LEN}}}"
_BATCH_ID_RE = re.compile(_BATCH_ID, re.ASCII)
# A batch's ids joined by commas (which no valid id holds): all of them checked in one match.
_BATCH_IDS_RE = re.compile(f"{_BATCH_ID}(?:,{_BATCH_ID})*", re.ASCII)
# string.punctuation is exactly SQS's punctuation set: !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~
_FIFO_ID_RE = re.compile(
    f"[A-Za-z0-9{re.escape(string.punctuation)}]{{1,{limits.FIFO_ID_MAX_LEN}}}", re.ASCII
)

try:  # CPython's own MD5: on a short input it costs half of OpenSSL's, whose set-up dominates
    from _md5 import md5 as _short_md5
except ImportError:  # an interpreter built without it
    _short_md5 = hashlib.md5
_SHORT_MD5_BYTES = 2048  # past about this OpenSSL's is the faster (measured: 1.2 vs 0.25 us
# for a 100-byte body, even at 4 KB, 1.6x slower at 256 KB)

_STRING_TRANSPORT = b"\x01"
_BINARY_TRANSPORT = b"\x02"


@quick_init
@dataclass(frozen=True)
class MessageAttributeValue:
    data_type: str  # "String", "Number", "Binary", optionally "Type.customLabel"
    string_value: str | None = None
    binary_value: bytes | None = None

    @property
    def base_type(self) -> str:
        return self.data_type.split(".", 1)[0]


def _has_invalid_chars(text: str) -> bool:
    # A printable string (no control, surrogate, private-use or unassigned character; U+FFFE
    # and U+FFFF are unassigned) has only allowed characters: str.isprintable runs ~20x faster
    # than the pattern, which decides only for the rest (newlines and tabs among them).
    return not text.isprintable() and _INVALID_CHAR_RE.search(text) is not None


def validate_body(body: str) -> Rejection | None:
    if not body:
        return reject(
            ErrorCode.MISSING_PARAMETER, "The request must contain the parameter MessageBody."
        )
    if _has_invalid_chars(body):
        return reject(ErrorCode.INVALID_MESSAGE_CONTENTS, _INVALID_CHARS_MESSAGE)
    return None


def _is_sqs_number(text: str) -> bool:
    if not _NUMBER_RE.fullmatch(text):
        return False
    try:
        value = Decimal(text)
    except InvalidOperation:
        return False
    if value.is_zero():
        return True
    # SQS trims leading/trailing zeros before counting digits. (Not normalize(): that rounds
    # to the context's 28-digit precision.)
    digits = "".join(map(str, value.as_tuple().digits)).strip("0")
    if len(digits) > _NUMBER_MAX_DIGITS:
        return False
    return _NUMBER_MIN <= abs(value) <= _NUMBER_MAX


def _invalid(message: str) -> Rejection:
    return reject(ErrorCode.INVALID_PARAMETER_VALUE, message)


def _validate_attribute_name(name: str) -> Rejection | None:
    if not name:
        return _invalid("The request must contain non-empty message (user) attribute names.")
    if len(name) > limits.MESSAGE_ATTRIBUTE_NAME_MAX_LEN:
        return _invalid(
            f"Message (user) attribute name must be shorter than "
            f"{limits.MESSAGE_ATTRIBUTE_NAME_MAX_LEN + 1} bytes."
        )
    if not _ATTR_NAME_RE.fullmatch(name):
        return _invalid(
            f"Message (user) attribute name '{name}' can only contain upper and lower case "
            "characters, digits, periods, hyphens and underscores."
        )
    lowered = name.lower()
    if lowered.startswith(("aws.", "amazon.")):
        return _invalid(
            "You can't use message attribute names beginning with 'AWS.' or 'Amazon.'. "
            "These strings are reserved for internal use."
        )
    if name.startswith(".") or name.endswith(".") or ".." in name:
        return _invalid(
            f"Message (user) attribute name '{name}' can't start or end with a period, "
            "or contain two successive periods."
        )
    return None


def _validate_attribute_value(name: str, value: MessageAttributeValue) -> Rejection | None:
    dtype = value.data_type
    if not dtype:
        return _invalid(f"The message (user) attribute '{name}' must contain a non-empty type.")
    if len(dtype) > limits.MESSAGE_ATTRIBUTE_TYPE_MAX_LEN:
        return _invalid(
            f"Message (user) attribute '{name}' type must be shorter than "
            f"{limits.MESSAGE_ATTRIBUTE_TYPE_MAX_LEN + 1} bytes."
        )
    base, dot, label = dtype.partition(".")
    if base not in _BASE_TYPES or (dot and (not label or _has_invalid_chars(label))):
        return _invalid(
            f"The type of message (user) attribute '{name}' is invalid. You must use only the "
            "following supported type prefixes: Binary, Number, String."
        )
    if base == "Binary":
        if value.string_value is not None:
            return _invalid(
                f"Message (user) attribute '{name}' with type 'Binary' must use field 'Binary'."
            )
        if not value.binary_value:
            return _invalid(
                f"Message (user) attribute '{name}' must contain a non-empty value "
                "of type 'Binary'."
            )
        return None
    if value.binary_value is not None:
        return _invalid(
            f"Message (user) attribute '{name}' with type '{base}' must use field 'String'."
        )
    if not value.string_value:
        return _invalid(
            f"Message (user) attribute '{name}' must contain a non-empty value of type '{base}'."
        )
    if _has_invalid_chars(value.string_value):
        # SQS reports bad characters in attribute values as a parameter error, not as
        # InvalidMessageContents.
        return _invalid(_INVALID_CHARS_MESSAGE)
    if base == "Number" and not _is_sqs_number(value.string_value):
        return _invalid(f"Can't cast the value of message (user) attribute '{name}' to a number.")
    return None


def validate_message_attributes(attrs: Mapping[str, MessageAttributeValue]) -> Rejection | None:
    if len(attrs) > limits.MESSAGE_ATTRIBUTES_MAX:
        return _invalid(
            f"Number of message attributes [{len(attrs)}] exceeds the allowed maximum "
            f"[{limits.MESSAGE_ATTRIBUTES_MAX}]."
        )
    for name in sorted(attrs):  # sorted: the same input always reports the same error
        rejection = _validate_attribute_name(name) or _validate_attribute_value(name, attrs[name])
        if rejection is not None:
            return rejection
    return None


def utf8_len(text: str) -> int:
    """The UTF-8 length of ``text``, counted without encoding it when it is ASCII."""
    # An ASCII str's UTF-8 length is its length, and str.isascii() reads a flag the str keeps
    # (CPython): no copy of a body up to 1 MiB just to count it. A lone surrogate (JSON can
    # carry one, "\ud800") is counted as its three bytes: the batch's size is judged, and the
    # entry is then refused as InvalidMessageContents, not the request as InternalError.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _value_bytes(value: MessageAttributeValue) -> bytes:
    if value.base_type == "Binary":
        return value.binary_value or b""
    return (value.string_value or "").encode("utf-8")


def message_size(body: str, attrs: Mapping[str, MessageAttributeValue]) -> int:
    """SQS's size: UTF-8 body bytes plus each attribute's name, data type and value bytes."""
    size = utf8_len(body)
    if not attrs:
        return size
    for name, value in attrs.items():
        size += len(name.encode("utf-8")) + len(value.data_type.encode("utf-8"))
        size += len(_value_bytes(value))
    return size


def check_message(
    body: str,
    attrs: Mapping[str, MessageAttributeValue],
    maximum_message_size: int,
) -> Rejection | None:
    """Every content rule for one message, in SQS's order, then the queue's size limit."""
    rejection = validate_body(body) or (validate_message_attributes(attrs) if attrs else None)
    if rejection is not None:
        return rejection
    if message_size(body, attrs) > maximum_message_size:
        return _invalid(
            "One or more parameters are invalid. Reason: Message must be shorter than "
            f"{maximum_message_size} bytes."
        )
    return None


def md5_of_body(body: str) -> str:
    data = body.encode("utf-8")
    return (_short_md5 if len(data) <= _SHORT_MD5_BYTES else hashlib.md5)(data).hexdigest()


def md5_of_message_system_attributes(aws_trace_header: str | None) -> str | None:
    """SQS's MD5OfMessageSystemAttributes: the same digest over {AWSTraceHeader: String}."""
    if aws_trace_header is None:
        return None
    return md5_of_message_attributes(
        {"AWSTraceHeader": MessageAttributeValue("String", aws_trace_header, None)})


def _length_prefixed(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def md5_of_message_attributes(attrs: Mapping[str, MessageAttributeValue]) -> str | None:
    """SQS's MD5OfMessageAttributes (the digest SDKs verify); None when there are none.

    Per attribute, in name order: length-prefixed name, length-prefixed data type, one
    transport byte (1 String/Number, 2 Binary), length-prefixed value; lengths are 4-byte
    big-endian.
    """
    if not attrs:
        return None
    digest = hashlib.md5()
    # Sort by the UTF-8 bytes, as the SDKs do; for the allowed ASCII names it is plain order.
    for name in sorted(attrs, key=lambda n: n.encode("utf-8")):
        value = attrs[name]
        digest.update(_length_prefixed(name.encode("utf-8")))
        digest.update(_length_prefixed(value.data_type.encode("utf-8")))
        binary = value.base_type == "Binary"
        digest.update(_BINARY_TRANSPORT if binary else _STRING_TRANSPORT)
        digest.update(_length_prefixed(_value_bytes(value)))
    return digest.hexdigest()


def validate_batch_entry_ids(ids: Sequence[str]) -> Rejection | None:
    n = len(ids)
    if n == 1:  # a lone call's batch of one
        if _BATCH_ID_RE.fullmatch(ids[0]):
            return None
    elif 0 < n <= limits.BATCH_MAX_ENTRIES:  # the usual batch, valid: one match, one set
        joined = ",".join(ids)
        if joined.count(",") == n - 1 and _BATCH_IDS_RE.fullmatch(joined) and \
                len(set(ids)) == n:
            return None
    # which rule it breaks, first in the batch's order
    if not ids:
        return reject(
            ErrorCode.EMPTY_BATCH_REQUEST,
            "There should be at least one entry in the batch request.",
        )
    if len(ids) > limits.BATCH_MAX_ENTRIES:
        return reject(
            ErrorCode.TOO_MANY_ENTRIES_IN_BATCH_REQUEST,
            f"Maximum number of entries per request are {limits.BATCH_MAX_ENTRIES}. "
            f"You have sent {len(ids)}.",
        )
    seen: set[str] = set()
    for entry_id in ids:
        if not _BATCH_ID_RE.fullmatch(entry_id):
            return reject(
                ErrorCode.INVALID_BATCH_ENTRY_ID,
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                f"underscores. It can be at most {limits.BATCH_ENTRY_ID_MAX_LEN} letters long.",
            )
        if entry_id in seen:
            return reject(ErrorCode.BATCH_ENTRY_IDS_NOT_DISTINCT, f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return None


def validate_fifo_id(value: str, parameter: str) -> Rejection | None:
    """MessageGroupId / MessageDeduplicationId: 1-128 ASCII alphanumerics and punctuation."""
    if not _FIFO_ID_RE.fullmatch(value):
        return _invalid(
            f"Value {value} for parameter {parameter} is invalid. Reason: {parameter} can only "
            "include alphanumeric and punctuation characters. 1 to 128 in length."
        )
    return None


def content_deduplication_id(body: str) -> str:
    """The deduplication id SQS derives when ContentBasedDeduplication is on."""
    return hashlib.sha256(body.encode("utf-8")).hexdigest()
