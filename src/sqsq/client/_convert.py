"""Conversions between the SDK's types (``sqsq.client.types``, boto3's shapes) and the
protobuf messages of ``sqsq.v1``, for the call builders (``_ops.py``) and the batch calls
(``batchcalls.py``): the fields of a send, the parse of each response, and the request id
that makes a send idempotent.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

from sqsq.client.types import (
    BatchError,
    BatchResult,
    BatchResultEntry,
    Message,
    MessageAttributes,
    SendBatchResultEntry,
    SendResult,
)
from sqsq.errors import error_for
from sqsq.v1 import queues_pb2 as pb

# A send's request id (its idempotency key on the server): this process's random prefix and
# a count, as unique as a random UUID's 32 hex digits without an urandom call per message
# (most are dropped anyway, when the batcher sends the message in a batch with an id of its
# own). A forked child draws a prefix of its own, so parent and child never share an id.
_request_ids: tuple[str, itertools.count] = (secrets.token_hex(8), itertools.count(1))


def _new_request_ids() -> None:
    global _request_ids
    _request_ids = (secrets.token_hex(8), itertools.count(1))


os.register_at_fork(after_in_child=_new_request_ids)


def request_id() -> str:
    """A new request id: 32 hex digits, never the same twice in any process."""
    prefix, count = _request_ids
    return f"{prefix}{next(count):016x}"


def _none_if_empty(value: str) -> str | None:
    return value or None


def attributes_to_pb(attrs: MessageAttributes | None) -> dict[str, pb.MessageAttributeValue]:
    """boto3-shaped message attributes to protobuf values."""
    out: dict[str, pb.MessageAttributeValue] = {}
    for name, value in (attrs or {}).items():
        if not isinstance(value, Mapping):
            raise TypeError(f"message attribute {name!r}: expected a dict with DataType")
        item = pb.MessageAttributeValue(data_type=str(value.get("DataType", "")))
        if value.get("StringValue") is not None:
            item.string_value = str(value["StringValue"])
        if value.get("BinaryValue") is not None:
            raw = value["BinaryValue"]
            item.binary_value = raw.encode() if isinstance(raw, str) else bytes(raw)
        out[name] = item
    return out


def attributes_from_pb(attrs: Mapping[str, pb.MessageAttributeValue]) -> MessageAttributes:
    """Protobuf message attributes to boto3's shape."""
    out: MessageAttributes = {}
    for name, value in attrs.items():
        item: dict[str, Any] = {"DataType": value.data_type}
        if value.HasField("string_value"):
            item["StringValue"] = value.string_value
        if value.HasField("binary_value"):
            item["BinaryValue"] = bytes(value.binary_value)
        out[name] = item
    return out


def send_fields(
    message_body: str,
    delay_seconds: int | None,
    message_attributes: MessageAttributes | None,
    message_group_id: str | None,
    message_deduplication_id: str | None,
    message_system_attributes: MessageAttributes | None = None,
) -> dict[str, Any]:
    fields: dict[str, Any] = {"message_body": message_body}
    if message_attributes:  # (most sends have none: no empty map to build and pass)
        fields["message_attributes"] = attributes_to_pb(message_attributes)
    if delay_seconds is not None:
        fields["delay_seconds"] = int(delay_seconds)
    if message_group_id is not None:
        fields["message_group_id"] = message_group_id
    if message_deduplication_id is not None:
        fields["message_deduplication_id"] = message_deduplication_id
    for name, value in (message_system_attributes or {}).items():
        if name != "AWSTraceHeader" or value.get("DataType") != "String" or \
                not isinstance(value.get("StringValue"), str):
            raise error_for("InvalidParameterValue", f"Message system attribute '{name}' is "
                            "invalid: only AWSTraceHeader, a String with a StringValue, is.")
        fields["aws_trace_header"] = value["StringValue"]
    return fields


def batch_errors(failed: Iterable[pb.BatchResultErrorEntry]) -> list[BatchError]:
    return [BatchError(f.id, f.code, f.message, f.sender_fault) for f in failed]


def parse_send(resp: pb.SendMessageResponse) -> SendResult:
    return SendResult(
        message_id=resp.message_id,
        md5_of_message_body=resp.md5_of_message_body,
        md5_of_message_attributes=_none_if_empty(resp.md5_of_message_attributes),
        sequence_number=_none_if_empty(resp.sequence_number),
        md5_of_message_system_attributes=_none_if_empty(resp.md5_of_message_system_attributes),
    )


def parse_send_batch(resp: pb.SendMessageBatchResponse) -> BatchResult:
    successful = [
        SendBatchResultEntry(  # (positional, empty strings as None: ten of these a call)
            s.id, s.message_id, s.md5_of_message_body, s.md5_of_message_attributes or None,
            s.sequence_number or None, s.md5_of_message_system_attributes or None)
        for s in resp.successful
    ]
    return BatchResult(successful=successful, failed=batch_errors(resp.failed))


def parse_batch(resp: pb.BatchResponse) -> BatchResult:
    return BatchResult(
        successful=[BatchResultEntry(i) for i in resp.successful],
        failed=batch_errors(resp.failed),
    )


def parse_message(m: pb.Message) -> Message:
    attributes, message_attributes = m.attributes, m.message_attributes
    return Message(
        m.message_id, m.receipt_handle, m.body, m.md5_of_body,
        m.md5_of_message_attributes or None,
        # (most receives ask for neither: no copy of an empty map)
        dict(attributes) if attributes else {},
        attributes_from_pb(message_attributes) if message_attributes else {},
    )


def no_result(_resp: Any) -> None:
    return None


def name_list(values: Iterable[str] | str | None) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        return [values]
    return list(values)
