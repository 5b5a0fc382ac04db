"""The call builders shared by ``Client`` and ``AsyncClient``, one per action.

Each action is a function returning a ``Call`` (``_call.py``): which RPC, the request
message, how to turn the response into the SDK's result and whether an UNAVAILABLE may be
retried. The two clients only differ in how they invoke it (blocking or awaited). The
conversions between protobuf messages and the SDK's types are in ``_convert.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqsq.client._call import MAX_WAIT_SECONDS, RECEIVE_DEADLINE_MARGIN, Call
from sqsq.client._convert import (
    name_list,
    no_result,
    parse_batch,
    parse_message,
    parse_send,
    parse_send_batch,
    request_id,
    send_fields,
)
from sqsq.client.types import MessageAttributes
from sqsq.errors import error_for
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import task_from_pb


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
    return Call("DeleteQueue", pb.QueueRequest(queue_url=queue), no_result)


def purge_queue(queue: str) -> Call:
    return Call("PurgeQueue", pb.QueueRequest(queue_url=queue), no_result)


def get_queue_attributes(queue: str, attribute_names: Iterable[str] | str = ("All",)) -> Call:
    req = pb.GetQueueAttributesRequest(queue_url=queue, attribute_names=name_list(attribute_names))
    return Call("GetQueueAttributes", req, lambda r: dict(r.attributes), retry=True)


def set_queue_attributes(queue: str, attributes: Mapping[str, str]) -> Call:
    req = pb.SetQueueAttributesRequest(
        queue_url=queue, attributes={k: str(v) for k, v in attributes.items()}
    )
    return Call("SetQueueAttributes", req, no_result)


def tag_queue(queue: str, tags: Mapping[str, str]) -> Call:
    return Call("TagQueue", pb.TagQueueRequest(queue_url=queue, tags=dict(tags)), no_result)


def untag_queue(queue: str, tag_keys: Iterable[str] | str) -> Call:
    req = pb.UntagQueueRequest(queue_url=queue, tag_keys=name_list(tag_keys))
    return Call("UntagQueue", req, no_result)


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
        return Call("SendMessage", req, parse_send, retry=True)
    fields = send_fields(
        message_body, delay_seconds, message_attributes, message_group_id,
        message_deduplication_id, message_system_attributes,
    )
    req = pb.SendMessageRequest(queue_url=queue, request_id=request_id(), **fields)
    return Call("SendMessage", req, parse_send, retry=True)


_PLAIN_ENTRY = frozenset({"Id", "MessageBody"})


def send_message_batch(queue: str, entries: Iterable[Mapping[str, Any]]) -> Call:
    req = pb.SendMessageBatchRequest(queue_url=queue, request_id=request_id())
    add = req.entries.add  # (each entry built in its place, not built apart and copied in)
    for entry in entries:
        if entry.keys() <= _PLAIN_ENTRY:  # the usual entry: an id and a body, nothing else
            add(id=str(entry.get("Id", "")), message_body=entry.get("MessageBody", ""))
            continue
        fields = send_fields(
            entry.get("MessageBody", ""),
            entry.get("DelaySeconds"),
            entry.get("MessageAttributes"),
            entry.get("MessageGroupId"),
            entry.get("MessageDeduplicationId"),
            entry.get("MessageSystemAttributes"),
        )
        add(id=str(entry.get("Id", "")), **fields)
    return Call("SendMessageBatch", req, parse_send_batch, retry=True)


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
    system = name_list(attribute_names)
    system += [n for n in name_list(message_system_attribute_names) if n not in system]
    req = pb.ReceiveMessageRequest(
        queue_url=queue,
        attribute_names=system,
        message_attribute_names=name_list(message_attribute_names),
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
        lambda r: [parse_message(m) for m in r.messages],
        retry=True,
        min_timeout=wait + RECEIVE_DEADLINE_MARGIN,
    )


# A delete is safe to make again whatever became of the first attempt: a message already
# gone deletes again successfully, and a superseded handle is refused either way. So a delete
# whose outcome is unknown (the shard's leader changed under it) is retried, as an AWS SDK
# retries one, rather than handed to the caller as ServiceUnavailable.


def delete_message(queue: str, receipt_handle: str) -> Call:
    req = pb.DeleteMessageRequest(queue_url=queue, receipt_handle=receipt_handle)
    return Call("DeleteMessage", req, no_result, retry=True)


def delete_message_batch(queue: str, entries: Iterable[Mapping[str, Any]]) -> Call:
    req = pb.DeleteMessageBatchRequest(queue_url=queue)
    add = req.entries.add  # (each entry built in its place, not built apart and copied in)
    for e in entries:
        add(id=str(e.get("Id", "")), receipt_handle=str(e.get("ReceiptHandle", "")))
    return Call("DeleteMessageBatch", req, parse_batch, retry=True)


def change_message_visibility(queue: str, receipt_handle: str, visibility_timeout: int) -> Call:
    req = pb.ChangeMessageVisibilityRequest(
        queue_url=queue, receipt_handle=receipt_handle, visibility_timeout=int(visibility_timeout)
    )
    return Call("ChangeMessageVisibility", req, no_result)


def change_message_visibility_batch(queue: str, entries: Iterable[Mapping[str, Any]]) -> Call:
    req = pb.ChangeMessageVisibilityBatchRequest(queue_url=queue)
    add = req.entries.add
    for n, e in enumerate(entries, 1):
        if e.get("VisibilityTimeout") is None:  # the wire's 0 would release the message
            raise error_for("MissingParameter", "The request must contain the parameter "
                            f"ChangeMessageVisibilityBatchRequestEntry.{n}.VisibilityTimeout.")
        add(id=str(e.get("Id", "")), receipt_handle=str(e.get("ReceiptHandle", "")),
            visibility_timeout=int(e["VisibilityTimeout"]))
    return Call("ChangeMessageVisibilityBatch", req, parse_batch)


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
