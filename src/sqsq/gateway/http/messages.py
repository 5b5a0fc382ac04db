"""Message actions: send, receive, delete, change visibility (single and batch).

Single actions are batches of one, as in the gRPC service; a failed single entry becomes the
request's error. On a cluster's gateway, a call for one shard is built as the node's request
and passed through (``through``).
"""

from __future__ import annotations

import base64
from typing import Any

from sqsq.api import QueueService
from sqsq.core import commands as c
from sqsq.core.messages import MessageAttributeValue
from sqsq.core.names import FIFO_SUFFIX
from sqsq.errors import from_rejection
from sqsq.gateway.http import through
from sqsq.gateway.http.wire import Params, b64decode, invalid
from sqsq.v1 import queues_pb2 as pb

Result = dict[str, Any]


def _attributes_in(p: Params) -> tuple[tuple[str, MessageAttributeValue], ...]:
    out = []
    for name, value in sorted(p.mapping("MessageAttributes").items()):
        if not isinstance(value, dict):
            raise invalid(f"The message attribute '{name}' must be a structure.")
        binary = value.get("BinaryValue")
        out.append((name, MessageAttributeValue(
            value.get("DataType") or "",
            value.get("StringValue"),
            b64decode(f"MessageAttribute.{name}.BinaryValue", binary)
            if binary is not None else None,
        )))
    return tuple(out)


def _attributes_out(attrs: tuple[tuple[str, MessageAttributeValue], ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, v in attrs:
        item: dict[str, Any] = {"DataType": v.data_type}
        if v.string_value is not None:
            item["StringValue"] = v.string_value
        if v.binary_value is not None:
            item["BinaryValue"] = base64.b64encode(v.binary_value).decode()
        out[name] = item
    return out


def _trace_header(p: Params) -> str | None:
    """MessageSystemAttributes: SQS takes exactly one, AWSTraceHeader, a String."""
    system = p.mapping("MessageSystemAttributes")
    for name in system:
        if name != "AWSTraceHeader":
            raise invalid(f"Message system attribute name '{name}' is invalid.")
    value = system.get("AWSTraceHeader")
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("DataType") != "String" or \
            not isinstance(value.get("StringValue"), str):
        raise invalid("The message system attribute AWSTraceHeader must be a String with a "
                      "StringValue.")
    return value["StringValue"]


def _entry(p: Params, entry_id: str) -> c.SendEntry:
    return c.SendEntry(entry_id, p.text("MessageBody") or "", p.integer("DelaySeconds"),
                       _attributes_in(p), p.text("MessageGroupId"),
                       p.text("MessageDeduplicationId"), _trace_header(p))


def _failed(failed: tuple[c.EntryFailed, ...]) -> list[Result]:
    return [{"Id": f.entry_id, "SenderFault": f.rejection.code.spec.sender_fault,
             "Code": f.rejection.sqs_code, "Message": f.rejection.message} for f in failed]


def _batch(result: c.BatchResult, successful: list[Result]) -> Result:
    # Successful is sent even when empty; an empty Failed is left out, as Amazon answers.
    out: Result = {"Successful": successful}
    if result.failed:
        out["Failed"] = _failed(result.failed)
    return out


def _single(result: c.BatchResult) -> None:
    if result.failed:
        raise from_rejection(result.failed[0].rejection)


def _send_pb(p: Params, out: Any) -> Any:
    through.fill_send(p, out, _attributes_in, _trace_header)
    return out


async def send_message(api: QueueService, p: Params) -> Result:
    p.required("MessageBody")
    key = p.queue()
    reply = await through.call(api, "SendMessage", key,
                               lambda: _send_pb(p, pb.SendMessageRequest()))
    if reply is not None:
        return through.sent(reply)
    result = await api.send_message_batch(key, [_entry(p, "0")])
    _single(result)
    return through.sent(result.successful[0])


async def _check_fifo_batch(api: QueueService, queue: str, entries: list[Params]) -> None:
    """On a FIFO queue Amazon checks every entry's group and deduplication ids first: one
    missing fails the whole request and nothing is sent."""
    if not queue.endswith(FIFO_SUFFIX):  # only FIFO queues have such names (keys end so)
        return
    if any(e.text("MessageGroupId") is None for e in entries):
        raise invalid("The request must contain the parameter MessageGroupId.")
    if any(e.text("MessageDeduplicationId") is None for e in entries):
        attrs = await api.get_queue_attributes(queue, ["ContentBasedDeduplication"])
        if attrs.get("ContentBasedDeduplication") != "true":
            raise invalid("The queue should either have ContentBasedDeduplication enabled or "
                          "MessageDeduplicationId provided explicitly")


async def send_message_batch(api: QueueService, p: Params) -> Result:
    given = p.entries()
    if through.passes(api) is not None:
        built = pb.SendMessageBatchRequest()
        try:
            for e in given:
                _send_pb(e, built.entries.add(id=e.text("Id") or ""))
        except through.CorePath:
            built = None
        key = p.queue()
        await _check_fifo_batch(api, key, given)
        reply = None if built is None else await through.call(
            api, "SendMessageBatch", key, lambda: built)
        if reply is not None:
            return through.batch(reply, [{"Id": s.id, **through.sent(s)}
                                         for s in reply.successful])
    entries = [_entry(e, e.text("Id") or "") for e in given]
    await _check_fifo_batch(api, p.queue(), given)
    result = await api.send_message_batch(p.queue(), entries)
    return _batch(result, [{"Id": s.entry_id, **through.sent(s)} for s in result.successful])


async def receive_message(api: QueueService, p: Params) -> Result:
    # MessageSystemAttributeNames replaced AttributeNames; SDKs send either.
    names = list(dict.fromkeys(p.strings("AttributeNames")
                               + p.strings("MessageSystemAttributeNames")))
    key = p.queue()
    reply = await through.call(api, "ReceiveMessage", key,
                               lambda: through.receive_request(p, names))
    if reply is not None:
        got = [through.message(m, _attributes_out) for m in reply.messages]
        return {"Messages": got} if got else {}
    messages = await api.receive_message(
        key, p.integer("MaxNumberOfMessages"), p.integer("VisibilityTimeout"),
        p.integer("WaitTimeSeconds"), names, p.strings("MessageAttributeNames"),
        p.text("ReceiveRequestAttemptId") or "")
    out = []
    for m in messages:
        item: Result = {"MessageId": m.message_id, "ReceiptHandle": m.receipt_handle,
                        "MD5OfBody": m.md5_of_body, "Body": m.body}
        if m.attributes:
            item["Attributes"] = dict(m.attributes)
        if m.message_attributes:
            item["MD5OfMessageAttributes"] = m.md5_of_message_attributes
            item["MessageAttributes"] = _attributes_out(m.message_attributes)
        out.append(item)
    return {"Messages": out} if out else {}  # SQS omits Messages when nothing was received


async def delete_message(api: QueueService, p: Params) -> Result:
    key = p.queue()
    if await through.call(api, "DeleteMessage", key, lambda: pb.DeleteMessageRequest(
            receipt_handle=p.required("ReceiptHandle"))) is not None:
        return {}
    _single(await api.delete_message_batch(key, [("0", p.required("ReceiptHandle"))]))
    return {}


async def delete_message_batch(api: QueueService, p: Params) -> Result:
    entries = [(e.text("Id") or "", e.required("ReceiptHandle")) for e in p.entries()]
    key = p.queue()
    reply = await through.call(api, "DeleteMessageBatch", key, lambda: pb.DeleteMessageBatchRequest(
        entries=[pb.DeleteMessageBatchEntry(id=i, receipt_handle=h) for i, h in entries]))
    if reply is not None:
        return through.batch(reply, [{"Id": i} for i in reply.successful])
    result = await api.delete_message_batch(key, entries)
    return _batch(result, [{"Id": i} for i in result.successful])


async def change_message_visibility(api: QueueService, p: Params) -> Result:
    entry = ("0", p.required("ReceiptHandle"), p.integer("VisibilityTimeout", required=True))
    key = p.queue()
    if await through.call(api, "ChangeMessageVisibility", key, lambda: through.visibility(
            p, pb.ChangeMessageVisibilityRequest())) is not None:
        return {}
    _single(await api.change_message_visibility_batch(key, [entry]))
    return {}


async def change_message_visibility_batch(api: QueueService, p: Params) -> Result:
    given = p.entries()
    entries = [(e.text("Id") or "", e.required("ReceiptHandle"),
                e.integer("VisibilityTimeout", required=True)) for e in given]
    key = p.queue()

    def build() -> pb.ChangeMessageVisibilityBatchRequest:
        out = pb.ChangeMessageVisibilityBatchRequest()
        for e in given:
            through.visibility(e, out.entries.add(id=e.text("Id") or ""))
        return out

    reply = await through.call(api, "ChangeMessageVisibilityBatch", key, build)
    if reply is not None:
        return through.batch(reply, [{"Id": i} for i in reply.successful])
    result = await api.change_message_visibility_batch(key, entries)
    return _batch(result, [{"Id": i} for i in result.successful])
