"""Message actions on a cluster's gateway: the node's protobuf request built from the SQS
request's parameters, passed to the queue's shard as it is (``routing.pass_through``), and the
node's reply rendered as SQS's, with no stop in the core's terms on the way. Each function
answers None when the call is not for one shard (a partitioned queue's receive, a batch over
several partitions, a queue this gateway has not seen yet) or holds what the wire cannot carry
(a number past 32 bits): ``messages`` then takes the core's path, which also says why a
request is wrong. The parameters are read with the same checks, in the same order.
"""

from __future__ import annotations

from typing import Any

from sqsq.api import QueueService
from sqsq.gateway import convert
from sqsq.gateway.http.wire import Params
from sqsq.v1 import queues_pb2 as pb

Result = dict[str, Any]
_INT32 = range(-(2**31), 2**31)


class CorePath(Exception):
    """What the wire cannot carry as it is: take the core's path."""


def passes(api: QueueService) -> Any:
    """The api's pass-through, if it has one (a cluster's gateway)."""
    return getattr(api, "pass_through", None)


def _int(p: Params, name: str, required: bool = False) -> int | None:
    value = p.integer(name, required)
    if value is not None and value not in _INT32:
        raise CorePath
    return value


def fill_send(p: Params, out: Any, attributes: Any, trace_header: Any) -> None:
    """A SendMessageRequest or SendMessageBatchEntry from the parameters (``messages``'
    readers of attributes and the trace header, for their checks)."""
    out.message_body = p.text("MessageBody") or ""
    delay = _int(p, "DelaySeconds")
    if delay is not None:
        out.delay_seconds = delay
    for name, value in convert.attrs_to_pb(attributes(p)).items():
        out.message_attributes[name].CopyFrom(value)
    group, dedup = p.text("MessageGroupId"), p.text("MessageDeduplicationId")
    if group is not None:
        out.message_group_id = group
    if dedup is not None:
        out.message_deduplication_id = dedup
    trace = trace_header(p)
    if trace is not None:
        out.aws_trace_header = trace


def sent(s: Any) -> Result:
    """A send's result as SQS answers it: a node's SendMessageResponse or
    SendMessageBatchResultEntry, or a single server's ``SentMessage`` (same fields)."""
    out: Result = {"MessageId": s.message_id, "MD5OfMessageBody": s.md5_of_message_body}
    if s.md5_of_message_attributes:
        out["MD5OfMessageAttributes"] = s.md5_of_message_attributes
    if s.md5_of_message_system_attributes:
        out["MD5OfMessageSystemAttributes"] = s.md5_of_message_system_attributes
    if s.sequence_number:
        out["SequenceNumber"] = s.sequence_number
    return out


def batch(reply: Any, successful: list[Result]) -> Result:
    # Successful is sent even when empty; an empty Failed is left out, as Amazon answers.
    out: Result = {"Successful": successful}
    if reply.failed:
        out["Failed"] = [{"Id": f.id, "SenderFault": f.sender_fault, "Code": f.code,
                          "Message": f.message} for f in reply.failed]
    return out


async def call(api: QueueService, method: str, key: str, build: Any) -> Any | None:
    """``build()``'s request passed to its shard: the node's reply, or None (the core's
    path)."""
    through = passes(api)
    if through is None:
        return None
    try:
        request = build()
    except CorePath:
        return None
    return await through(method, request, key)


def receive_request(p: Params, names: list[str]) -> pb.ReceiveMessageRequest:
    request = pb.ReceiveMessageRequest(attribute_names=names)
    for field, name in (("max_number_of_messages", "MaxNumberOfMessages"),
                        ("visibility_timeout", "VisibilityTimeout"),
                        ("wait_time_seconds", "WaitTimeSeconds")):
        value = _int(p, name)
        if value is not None:
            setattr(request, field, value)
    request.message_attribute_names.extend(p.strings("MessageAttributeNames"))
    request.receive_request_attempt_id = p.text("ReceiveRequestAttemptId") or ""
    return request


def visibility(p: Params, out: Any) -> Any:
    out.receipt_handle = p.required("ReceiptHandle")
    out.visibility_timeout = _int(p, "VisibilityTimeout", required=True)
    return out


def message(m: pb.Message, attributes_out: Any) -> Result:
    """A received message as SQS's (``attributes_out``: ``messages``' renderer)."""
    item: Result = {"MessageId": m.message_id, "ReceiptHandle": m.receipt_handle,
                    "MD5OfBody": m.md5_of_body, "Body": m.body}
    if m.attributes:
        item["Attributes"] = dict(sorted(m.attributes.items()))
    if m.message_attributes:
        item["MD5OfMessageAttributes"] = m.md5_of_message_attributes
        item["MessageAttributes"] = attributes_out(convert.attrs_from_pb(m.message_attributes))
    return item
