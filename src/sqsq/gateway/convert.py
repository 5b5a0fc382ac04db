"""The protobuf wire (sqsq.v1) to and from the core's values, both ways, in one place.

The public gRPC service reads requests and writes responses with these; the forwarding
backend (a gateway in front of a node) writes requests and reads responses with the same
functions, so a value crosses the wire unchanged in either direction.
"""

from __future__ import annotations

from typing import Any

from sqsq.core import commands as c
from sqsq.core.messages import MessageAttributeValue
from sqsq.errors import BY_SQS_CODE, ErrorCode, Rejection
from sqsq.v1 import queues_pb2 as pb


def opt(msg: Any, field: str) -> Any:
    """A proto3 ``optional`` field's value, or None when absent."""
    return getattr(msg, field) if msg.HasField(field) else None


def attrs_from_pb(attrs: Any) -> c.MessageAttributes:
    if not attrs:  # the common case; iterating an empty protobuf map still costs
        return ()
    return tuple(
        (name, MessageAttributeValue(
            v.data_type,
            v.string_value if v.HasField("string_value") else None,
            v.binary_value if v.HasField("binary_value") else None,
        ))
        for name, v in sorted(attrs.items())
    )


def attrs_to_pb(attrs: c.MessageAttributes) -> dict[str, pb.MessageAttributeValue]:
    out = {}
    for name, v in attrs:
        pv = pb.MessageAttributeValue(data_type=v.data_type)
        if v.string_value is not None:
            pv.string_value = v.string_value
        if v.binary_value is not None:
            pv.binary_value = v.binary_value
        out[name] = pv
    return out


# ---- sends ------------------------------------------------------------------------------


def entry_from_pb(e: Any, entry_id: str) -> c.SendEntry:
    """A SendMessageRequest or SendMessageBatchEntry as the core's entry."""
    has = e.HasField  # (inline, not ``opt``: this runs for every message sent)
    return c.SendEntry(
        entry_id, e.message_body,
        e.delay_seconds if has("delay_seconds") else None,
        attrs_from_pb(e.message_attributes),
        e.message_group_id if has("message_group_id") else None,
        e.message_deduplication_id if has("message_deduplication_id") else None,
        e.aws_trace_header if has("aws_trace_header") else None,
    )


def entry_to_pb(e: c.SendEntry) -> pb.SendMessageBatchEntry:
    out = pb.SendMessageBatchEntry(id=e.entry_id, message_body=e.body,
                                   message_attributes=attrs_to_pb(e.message_attributes))
    if e.delay_seconds is not None:
        out.delay_seconds = e.delay_seconds
    if e.message_group_id is not None:
        out.message_group_id = e.message_group_id
    if e.message_deduplication_id is not None:
        out.message_deduplication_id = e.message_deduplication_id
    if e.aws_trace_header is not None:
        out.aws_trace_header = e.aws_trace_header
    return out


def sent_response(s: c.SentMessage) -> pb.SendMessageResponse:
    """SendMessage's response (the optional digests and sequence number set only when
    there is one: an empty string is no field on the wire either way, and no keyword dict)."""
    out = pb.SendMessageResponse(message_id=s.message_id,
                                 md5_of_message_body=s.md5_of_message_body)
    _set_optional(out, s)
    return out


def _set_optional(out: Any, s: c.SentMessage) -> None:
    """A sent message's optional fields, on ``out`` (a response or a batch result entry)."""
    if s.md5_of_message_attributes:
        out.md5_of_message_attributes = s.md5_of_message_attributes
    if s.sequence_number:
        out.sequence_number = s.sequence_number
    if s.md5_of_message_system_attributes:
        out.md5_of_message_system_attributes = s.md5_of_message_system_attributes


def add_sent(out: Any, successful: tuple[c.SentMessage, ...]) -> None:
    """SendMessageBatchResultEntry's for ``successful``, added to the repeated field ``out``
    (built in place: no keyword dict and no copy per message)."""
    add = out.add
    for s in successful:
        _set_optional(add(id=s.entry_id, message_id=s.message_id,
                          md5_of_message_body=s.md5_of_message_body), s)


def sent_from_pb(s: pb.SendMessageBatchResultEntry) -> c.SentMessage:
    return c.SentMessage(s.id, s.message_id, s.md5_of_message_body,
                         s.md5_of_message_attributes or None, s.sequence_number or None,
                         s.md5_of_message_system_attributes or None)


# ---- batch failures -----------------------------------------------------------------------


def failed_to_pb(failed: tuple[c.EntryFailed, ...]) -> list[pb.BatchResultErrorEntry]:
    return [
        pb.BatchResultErrorEntry(id=f.entry_id, code=f.rejection.sqs_code,
                                 message=f.rejection.message,
                                 sender_fault=f.rejection.code.spec.sender_fault)
        for f in failed
    ]


def failed_from_pb(failed: Any) -> tuple[c.EntryFailed, ...]:
    return tuple(
        c.EntryFailed(f.id, Rejection(BY_SQS_CODE.get(f.code, ErrorCode.INTERNAL_ERROR),
                                      f.message))
        for f in failed
    )


def batch_from_pb(r: pb.BatchResponse) -> c.BatchResult:
    return c.BatchResult(tuple(r.successful), failed_from_pb(r.failed))


# ---- receives -----------------------------------------------------------------------------


def message_to_pb(m: c.ReceivedMessage) -> pb.Message:
    return fill_message(pb.Message(), m)


def add_messages(out: Any, messages: list[c.ReceivedMessage]) -> None:
    """``messages`` added to the repeated field ``out`` (each built in place, not copied in)."""
    add = out.add
    for m in messages:
        fill_message(add(), m)


def fill_message(out: pb.Message, m: c.ReceivedMessage) -> pb.Message:
    out.message_id = m.message_id
    out.receipt_handle = m.receipt_handle
    out.body = m.body
    out.md5_of_body = m.md5_of_body
    # (set only when there is something: most receives ask for no attributes)
    if m.md5_of_message_attributes:
        out.md5_of_message_attributes = m.md5_of_message_attributes
    if m.attributes:
        out.attributes.update(m.attributes)
    if m.message_attributes:
        for name, v in m.message_attributes:
            pv = out.message_attributes[name]
            pv.data_type = v.data_type
            if v.string_value is not None:
                pv.string_value = v.string_value
            if v.binary_value is not None:
                pv.binary_value = v.binary_value
    return out


def message_from_pb(m: pb.Message) -> c.ReceivedMessage:
    return c.ReceivedMessage(
        m.message_id, m.receipt_handle, m.body, m.md5_of_body,
        m.md5_of_message_attributes or None, attrs_from_pb(m.message_attributes),
        tuple(sorted(m.attributes.items())),
    )
