"""Answers recorded against Amazon SQS itself, checked in both protocols (``wire``)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from sqswire import Failed, Wire


def test_validation_errors_name_amazons_json_shapes(wire: Wire,
                                                    new_queue: Callable[..., str]) -> None:
    """InvalidParameterValue and MissingParameter: the JSON __type names Amazon's shape; the
    code, HTTP status and message stay."""
    url = new_queue()
    with pytest.raises(Failed) as e:
        wire("ReceiveMessage", QueueUrl=url, MaxNumberOfMessages=11)
    assert (e.value.status, e.value.code) == (400, "InvalidParameterValue")
    if wire.protocol == "json":
        assert e.value.shape == "InvalidParameterValueException"
    with pytest.raises(Failed) as e:
        wire("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle="",
             VisibilityTimeout=1)
    assert (e.value.status, e.value.code) == (400, "MissingParameter")
    if wire.protocol == "json":
        assert e.value.shape == "MissingRequiredParameterException"


def test_fifo_queue_attribute_is_unknown_on_standard_queues(
        wire: Wire, new_queue: Callable[..., str]) -> None:
    """FifoQueue on a standard queue, "false" included: 400 InvalidAttributeName."""
    name = f"std-{uuid.uuid4().hex[:10]}"
    with pytest.raises(Failed) as e:
        wire("CreateQueue", QueueName=name, Attributes={"FifoQueue": "false"})
    assert (e.value.status, e.value.code, e.value.message) == (
        400, "InvalidAttributeName", "Unknown Attribute FifoQueue.")
    url = new_queue()
    for value in ("false", "true"):
        with pytest.raises(Failed) as e:
            wire("SetQueueAttributes", QueueUrl=url, Attributes={"FifoQueue": value})
        assert (e.value.status, e.value.code, e.value.message) == (
            400, "InvalidAttributeName", "Unknown Attribute FifoQueue.")


def _arn(wire: Wire, url: str) -> str:
    return wire("GetQueueAttributes", QueueUrl=url, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]


def test_message_move_task_handles_and_errors(wire: Wire,
                                              new_queue: Callable[..., str]) -> None:
    dlq = new_queue("dlq")
    dlq_arn = _arn(wire, dlq)
    new_queue("src", RedrivePolicy=json.dumps({"deadLetterTargetArn": dlq_arn,
                                               "maxReceiveCount": 1}))
    wire("SendMessage", QueueUrl=dlq, MessageBody="dead")  # something to move, slowly
    handle = wire("StartMessageMoveTask", SourceArn=dlq_arn,
                  MaxNumberOfMessagesPerSecond=1)["TaskHandle"]
    doc = json.loads(base64.b64decode(handle))
    assert doc["sourceArn"] == dlq_arn and len(doc["taskId"]) == 36

    def fails(action: str, **params: Any) -> tuple[int, str, str]:
        with pytest.raises(Failed) as e:
            wire(action, **params)
        return e.value.status, e.value.code, e.value.message

    assert fails("StartMessageMoveTask", SourceArn=dlq_arn) == (
        400, "InvalidParameterValue", "There is already a task running. Only one active task "
        "is allowed for a source queue arn at a given time.")
    assert fails("CancelMessageMoveTask", TaskHandle="garbage") == (
        400, "InvalidParameterValue", "Value for parameter TaskHandle is invalid.")
    no_queue = base64.b64encode(json.dumps(
        {"taskId": doc["taskId"], "sourceArn": dlq_arn + "-gone"}).encode()).decode()
    assert fails("CancelMessageMoveTask", TaskHandle=no_queue) == (
        404, "ResourceNotFoundException",
        "The resource that you specified for the SourceArn parameter doesn't exist.")
    no_task = base64.b64encode(json.dumps(
        {"taskId": "00000000-0000-4000-a000-000000000000", "sourceArn": dlq_arn}).encode())
    assert fails("CancelMessageMoveTask", TaskHandle=no_task.decode()) == (
        404, "ResourceNotFoundException", "Task does not exist.")
    wire("CancelMessageMoveTask", TaskHandle=handle)


def test_fifo_batch_checks_every_entry_first(wire: Wire, new_queue: Callable[..., str]) -> None:
    """One entry without a group id, or without a deduplication id while content-based
    deduplication is off, fails the whole SendMessageBatch: nothing is sent."""
    url = new_queue(fifo=True)
    good = {"Id": "a", "MessageBody": "a", "MessageGroupId": "g", "MessageDeduplicationId": "a"}
    for bad, message in (
        ({"Id": "b", "MessageBody": "b", "MessageDeduplicationId": "b"},
         "The request must contain the parameter MessageGroupId."),
        ({"Id": "b", "MessageBody": "b", "MessageGroupId": "g"},
         "The queue should either have ContentBasedDeduplication enabled or "
         "MessageDeduplicationId provided explicitly"),
    ):
        with pytest.raises(Failed) as e:
            wire("SendMessageBatch", QueueUrl=url, Entries=[good, bad])
        assert (e.value.status, e.value.code, e.value.message) == (
            400, "InvalidParameterValue", message)
    assert "Messages" not in wire("ReceiveMessage", QueueUrl=url, WaitTimeSeconds=0)
    cbd = new_queue(fifo=True, ContentBasedDeduplication="true")
    result = wire("SendMessageBatch", QueueUrl=cbd, Entries=[
        good, {"Id": "b", "MessageBody": "b", "MessageGroupId": "g"}])
    assert sorted(s["Id"] for s in result["Successful"]) == ["a", "b"]


def test_timed_out_handles(wire: Wire, new_queue: Callable[..., str]) -> None:
    """A handle whose visibility timeout ran out (here: set to 0), nobody having received the
    message since: on a FIFO queue it no longer deletes; on a standard queue it still changes
    the visibility."""
    fifo = new_queue(fifo=True, ContentBasedDeduplication="true")
    wire("SendMessage", QueueUrl=fifo, MessageBody="f", MessageGroupId="g")
    (m,) = wire("ReceiveMessage", QueueUrl=fifo)["Messages"]
    wire("ChangeMessageVisibility", QueueUrl=fifo, ReceiptHandle=m["ReceiptHandle"],
         VisibilityTimeout=0)
    with pytest.raises(Failed) as e:
        wire("DeleteMessage", QueueUrl=fifo, ReceiptHandle=m["ReceiptHandle"])
    assert (e.value.status, e.value.code, e.value.message) == (
        400, "InvalidParameterValue", f"Value {m['ReceiptHandle']} for parameter ReceiptHandle "
        "is invalid. Reason: The receipt handle has expired.")
    (again,) = wire("ReceiveMessage", QueueUrl=fifo)["Messages"]  # the message stayed
    assert again["MessageId"] == m["MessageId"]

    std = new_queue()
    wire("SendMessage", QueueUrl=std, MessageBody="s")
    (m,) = wire("ReceiveMessage", QueueUrl=std)["Messages"]
    wire("ChangeMessageVisibility", QueueUrl=std, ReceiptHandle=m["ReceiptHandle"],
         VisibilityTimeout=0)
    wire("ChangeMessageVisibility", QueueUrl=std, ReceiptHandle=m["ReceiptHandle"],
         VisibilityTimeout=60)  # applies: hidden again
    assert "Messages" not in wire("ReceiveMessage", QueueUrl=std, WaitTimeSeconds=0)
    wire("DeleteMessage", QueueUrl=std, ReceiptHandle=m["ReceiptHandle"])


def test_purge_clears_fifo_deduplication(wire: Wire, new_queue: Callable[..., str]) -> None:
    url = new_queue(fifo=True)
    first = wire("SendMessage", QueueUrl=url, MessageBody="x", MessageGroupId="g",
                 MessageDeduplicationId="d")
    wire("PurgeQueue", QueueUrl=url)
    again = wire("SendMessage", QueueUrl=url, MessageBody="x", MessageGroupId="g",
                 MessageDeduplicationId="d")
    assert again["MessageId"] != first["MessageId"]
    (m,) = wire("ReceiveMessage", QueueUrl=url)["Messages"]
    assert m["MessageId"] == again["MessageId"]
