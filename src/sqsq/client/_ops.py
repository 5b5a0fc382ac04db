"""Request building and response parsing shared by ``Client`` and ``AsyncClient``.

Each action is a function returning a ``Call`` (``_call.py``): which RPC, the request
message, how to turn the response into the SDK's result and whether an UNAVAILABLE may be
retried. The two clients only differ in how they invoke it (blocking or awaited).
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

from sqsq.client._call import MAX_WAIT_SECONDS, RECEIVE_DEADLINE_MARGIN, Call
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
from sqsq.wire import task_from_pb

# -- conversions ---------------------------------------------------------------------------


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


def _send_fields(
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


def _batch_errors(failed: Iterable[pb.BatchResultErrorEntry]) -> list[BatchError]:
    return [BatchError(f.id, f.code, f.message, f.sender_fault) for f in failed]


def _parse_send(resp: pb.SendMessageResponse) -> SendResult:
    return SendResult(
        message_id=resp.message_id,
        md5_of_message_body=resp.md5_of_message_body,
        md5_of_message_attributes=_none_if_empty(resp.md5_of_message_attributes),
        sequence_number=_none_if_empty(resp.sequence_number),
        md5_of_message_system_attributes=_none_if_empty(resp.md5_of_message_system_attributes),
    )


def _parse_send_batch(resp: pb.SendMessageBatchResponse) -> BatchResult:
    successful = [
        SendBatchResultEntry(  # (positional, empty strings as None: ten of these a call)
            s.id, s.message_id, s.md5_of_message_body, s.md5_of_message_attributes or None,
            s.sequence_number or None, s.md5_of_message_system_attributes or None)
        for s in resp.successful
    ]
    return BatchResult(successful=successful, failed=_batch_errors(resp.failed))


def _parse_batch(resp: pb.BatchResponse) -> BatchResult:
    return BatchResult(
        successful=[BatchResultEntry(i) for i in resp.successful],
        failed=_batch_errors(resp.failed),
    )


def _parse_message(m: pb.Message) -> Message:
    attributes, message_attributes = m.attributes, m.message_attributes
    return Message(
        m.message_id, m.receipt_handle, m.body, m.md5_of_body,
        m.md5_of_message_attributes or None,
        # (most receives ask for neither: no copy of an empty map)
        dict(attributes) if attributes else {},
        attributes_from_pb(message_attributes) if message_attributes else {},
    )


def _none(_resp: Any) -> None:
    return None


def _names(values: Iterable[str] | str | None) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        return [values]
    return list(values)


# -- actions -------------------------------------------------------------------------------


def create_queue(
    queue_name: str,
    attributes: Mapping[str, str] | None = None,
    tags: Mapping[str, str] | None = None,
) -> Call:
    req = pb.CreateQueueRequest(
        queue_name=queue_name,
        attributes={k: str(v) for k, v in (attributes or {}).items()},
        tags=dict(tags or {}),
    )
    return Call("CreateQueue", req, lambda r: r.queue_url)


def get_queue_url(queue_name: str, queue_owner_aws_account_id: str | None = None) -> Call:
    req = pb.GetQueueUrlRequest(
        queue_name=queue_name, queue_owner_aws_account_id=queue_owner_aws_account_id or ""
    )
    return Call("GetQueueUrl", req, lambda r: r.queue_url, retry=True)


def list_queues_page(
    queue_name_prefix: str = "", max_results: int | None = None, next_token: str | None = None
) -> Call:
    req = pb.ListQueuesRequest(
        queue_name_prefix=queue_name_prefix or "",
        next_token=next_token or "",
    )
    if max_results is not None:
        req.max_results = int(max_results)
    return Call(
        "ListQueues", req, lambda r: (list(r.queue_urls), r.next_token or None), retry=True
    )


def list_queues(
    queue_name_prefix: str = "", max_results: int | None = None, next_token: str | None = None
) -> Call:
    page = list_queues_page(queue_name_prefix, max_results, next_token)
    return Call(page.method, page.request, lambda r: list(r.queue_urls), retry=True)


def delete_queue(queue: str) -> Call:
    return Call("DeleteQueue", pb.QueueRequest(queue_url=queue), _none)


def purge_queue(queue: str) -> Call:
    return Call("PurgeQueue", pb.QueueRequest(queue_url=queue), _none)


def get_queue_attributes(queue: str, attribute_names: Iterable[str] | str = ("All",)) -> Call:
    req = pb.GetQueueAttributesRequest(queue_url=queue, attribute_names=_names(attribute_names))
    return Call("GetQueueAttributes", req, lambda r: dict(r.attributes), retry=True)


def set_queue_attributes(queue: str, attributes: Mapping[str, str]) -> Call:
    req = pb.SetQueueAttributesRequest(
        queue_url=queue, attributes={k: str(v) for k, v in attributes.items()}
    )
    return Call("SetQueueAttributes", req, _none)


def tag_queue(queue: str, tags: Mapping[str, str]) -> Call:
    return Call("TagQueue", pb.TagQueueRequest(queue_url=queue, tags=dict(tags)), _none)


def untag_queue(queue: str, tag_keys: Iterable[str] | str) -> Call:
    req = pb.UntagQueueRequest(queue_url=queue, tag_keys=_names(tag_keys))
    return Call("UntagQueue", req, _none)


def list_queue_tags(queue: str) -> Call:
    return Call(
        "ListQueueTags", pb.QueueRequest(queue_url=queue), lambda r: dict(r.tags), retry=True
    )


def list_dead_letter_source_queues(queue: str) -> Call:
    return Call(
        "ListDeadLetterSourceQueues",
        pb.QueueRequest(queue_url=queue),
        lambda r: list(r.queue_urls),
        retry=True,
    )


def send_message(
    queue: str,
    message_body: str,
    delay_seconds: int | None = None,
    message_attributes: MessageAttributes | None = None,
    message_group_id: str | None = None,
    message_deduplication_id: str | None = None,
    message_system_attributes: MessageAttributes | None = None,
) -> Call:
    # One request id for every attempt: the server maps a retry to the first result.
    if delay_seconds is None and not message_attributes and message_group_id is None and \
            message_deduplication_id is None and not message_system_attributes:
        # (the usual send: a body and nothing else, with no keyword dict on the way)
        req = pb.SendMessageRequest(queue_url=queue, message_body=message_body,
                                    request_id=request_id())
        return Call("SendMessage", req, _parse_send, retry=True)
    fields = _send_fields(
        message_body, delay_seconds, message_attributes, message_group_id,
        message_deduplication_id, message_system_attributes,
    )
    req = pb.SendMessageRequest(queue_url=queue, request_id=request_id(), **fields)
    return Call("SendMessage", req, _parse_send, retry=True)


_PLAIN_ENTRY = frozenset({"Id", "MessageBody"})


def send_message_batch(queue: str, entries: Iterable[Mapping[str, Any]]) -> Call:
    req = pb.SendMessageBatchRequest(queue_url=queue, request_id=request_id())
    add = req.entries.add  # (each entry built in its place, not built apart and copied in)
    for entry in entries:
        if entry.keys() <= _PLAIN_ENTRY:  # the usual entry: an id and a body, nothing else
            add(id=str(entry.get("Id", "")), message_body=entry.get("MessageBody", ""))
            continue
        fields = _send_fields(
            entry.get("MessageBody", ""),
            entry.get("DelaySeconds"),
            entry.get("MessageAttributes"),
            entry.get("MessageGroupId"),
            entry.get("MessageDeduplicationId"),
            entry.get("MessageSystemAttributes"),
        )
        add(id=str(entry.get("Id", "")), **fields)
    return Call("SendMessageBatch", req, _parse_send_batch, retry=True)


def receive_message(
    queue: str,
    max_number_of_messages: int = 1,
    visibility_timeout: int | None = None,
    wait_time_seconds: int | None = None,
    attribute_names: Iterable[str] | str | None = None,
    message_attribute_names: Iterable[str] | str | None = None,
    message_system_attribute_names: Iterable[str] | str | None = None,
    receive_request_attempt_id: str = "",
) -> Call:
    # The wire has one list of system attribute names; boto3's two spellings merge into it.
    system = _names(attribute_names)
    system += [n for n in _names(message_system_attribute_names) if n not in system]
    req = pb.ReceiveMessageRequest(
        queue_url=queue,
        attribute_names=system,
        message_attribute_names=_names(message_attribute_names),
        receive_request_attempt_id=receive_request_attempt_id,
    )
    if max_number_of_messages is not None:
        req.max_number_of_messages = int(max_number_of_messages)
    if visibility_timeout is not None:
        req.visibility_timeout = int(visibility_timeout)
    if wait_time_seconds is not None:
        req.wait_time_seconds = int(wait_time_seconds)
    wait = MAX_WAIT_SECONDS if wait_time_seconds is None else max(0, int(wait_time_seconds))
    # Made again when its outcome is unknown (the shard's leader changed under it), as an AWS
    # SDK makes a receive again: whatever a lost attempt took stays hidden for its visibility
    # timeout either way, and the caller gets an answer instead of ServiceUnavailable. A FIFO
    # receive with a ReceiveRequestAttemptId is answered the first attempt's messages.
    return Call(
        "ReceiveMessage",
        req,
        lambda r: [_parse_message(m) for m in r.messages],
        retry=True,
        min_timeout=wait + RECEIVE_DEADLINE_MARGIN,
    )


# A delete is safe to make again whatever became of the first attempt: a message already
# gone deletes again successfully, and a superseded handle is refused either way. So a delete
# whose outcome is unknown (the shard's leader changed under it) is retried, as an AWS SDK
# retries one, rather than handed to the caller as ServiceUnavailable.


def delete_message(queue: str, receipt_handle: str) -> Call:
    req = pb.DeleteMessageRequest(queue_url=queue, receipt_handle=receipt_handle)
    return Call("DeleteMessage", req, _none, retry=True)


def delete_message_batch(queue: str, entries: Iterable[Mapping[str, Any]]) -> Call:
    req = pb.DeleteMessageBatchRequest(queue_url=queue)
    add = req.entries.add  # (each entry built in its place, not built apart and copied in)
    for e in entries:
        add(id=str(e.get("Id", "")), receipt_handle=str(e.get("ReceiptHandle", "")))
    return Call("DeleteMessageBatch", req, _parse_batch, retry=True)


def change_message_visibility(queue: str, receipt_handle: str, visibility_timeout: int) -> Call:
    req = pb.ChangeMessageVisibilityRequest(
        queue_url=queue, receipt_handle=receipt_handle, visibility_timeout=int(visibility_timeout)
    )
    return Call("ChangeMessageVisibility", req, _none)


def change_message_visibility_batch(queue: str, entries: Iterable[Mapping[str, Any]]) -> Call:
    req = pb.ChangeMessageVisibilityBatchRequest(queue_url=queue)
    add = req.entries.add
    for n, e in enumerate(entries, 1):
        if e.get("VisibilityTimeout") is None:  # the wire's 0 would release the message
            raise error_for("MissingParameter", "The request must contain the parameter "
                            f"ChangeMessageVisibilityBatchRequestEntry.{n}.VisibilityTimeout.")
        add(id=str(e.get("Id", "")), receipt_handle=str(e.get("ReceiptHandle", "")),
            visibility_timeout=int(e["VisibilityTimeout"]))
    return Call("ChangeMessageVisibilityBatch", req, _parse_batch)


def release_messages(queue: str, messages: Iterable[Any]) -> Call:
    """Received messages (anything with a ``receipt_handle``) made visible again now: what a
    receive took for a caller that will not get them."""
    return change_message_visibility_batch(queue, [
        {"Id": str(i), "ReceiptHandle": m.receipt_handle, "VisibilityTimeout": 0}
        for i, m in enumerate(messages)])


# ---- dead-letter redrive -----------------------------------------------------------------

def start_message_move_task(
    source_arn: str, destination_arn: str | None = None,
    max_number_of_messages_per_second: int | None = None, task_stamp: str = "",
) -> Call:
    req = pb.StartMessageMoveTaskRequest(source_arn=source_arn,
                                         destination_arn=destination_arn or "",
                                         task_stamp=task_stamp)
    if max_number_of_messages_per_second is not None:
        req.max_number_of_messages_per_second = int(max_number_of_messages_per_second)
    return Call("StartMessageMoveTask", req, lambda r: r.task_handle)


def list_message_move_tasks(source_arn: str, max_results: int | None = None) -> Call:
    req = pb.ListMessageMoveTasksRequest(source_arn=source_arn)
    if max_results is not None:
        req.max_results = int(max_results)
    return Call("ListMessageMoveTasks", req, lambda r: [task_from_pb(t) for t in r.results],
                retry=True)


def cancel_message_move_task(task_handle: str) -> Call:
    return Call("CancelMessageMoveTask", pb.CancelMessageMoveTaskRequest(task_handle=task_handle),
                lambda r: r.approximate_number_of_messages_moved)
