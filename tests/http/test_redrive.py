"""Dead-letter queues over HTTP: redrive on maxReceiveCount, and message move tasks back."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest


def _arn(sqs: Any, url: str) -> str:
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]


def _dead_letter(sqs: Any, src: str, bodies: list[str]) -> None:
    """Receive each message twice with visibility 0: maxReceiveCount 1 sends it to the DLQ."""
    for b in bodies:
        sqs.send_message(QueueUrl=src, MessageBody=b)
    received = 0
    while received < len(bodies):
        received += len(sqs.receive_message(QueueUrl=src, MaxNumberOfMessages=10,
                                            VisibilityTimeout=0).get("Messages", []))
    assert "Messages" not in sqs.receive_message(QueueUrl=src, MaxNumberOfMessages=10)


def _wait_task(sqs: Any, dlq_arn: str, timeout_s: float = 20) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        (task,) = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
        if task["Status"] != "RUNNING":
            return task
        time.sleep(0.2)  # polling a background task, not standing in for a clock
    raise AssertionError("move task did not finish")


@pytest.fixture
def redriven(sqs: Any, new_queue: Any) -> tuple[str, str, str]:
    dlq = new_queue("dlq")
    dlq_arn = _arn(sqs, dlq)
    src = new_queue("src", RedrivePolicy=json.dumps(
        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1}))
    return src, dlq, dlq_arn


def test_redrive_then_move_back_to_source(sqs: Any, redriven: tuple[str, str, str]) -> None:
    src, dlq, dlq_arn = redriven
    _dead_letter(sqs, src, ["d1", "d2", "d3"])
    attrs = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "3"
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [src]

    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    assert handle
    task = _wait_task(sqs, dlq_arn)
    assert task["Status"] == "COMPLETED"
    assert task["SourceArn"] == dlq_arn
    assert task["ApproximateNumberOfMessagesMoved"] == 3
    got = []
    while len(got) < 3:
        got += [m["Body"] for m in sqs.receive_message(
            QueueUrl=src, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])]
    assert sorted(got) == ["d1", "d2", "d3"]


def test_move_to_chosen_destination_and_cancel(sqs: Any, new_queue: Any,
                                               redriven: tuple[str, str, str]) -> None:
    src, dlq, dlq_arn = redriven
    _dead_letter(sqs, src, [f"m{i}" for i in range(6)])
    other = new_queue("other")
    handle = sqs.start_message_move_task(SourceArn=dlq_arn, DestinationArn=_arn(sqs, other),
                                         MaxNumberOfMessagesPerSecond=1)["TaskHandle"]
    with pytest.raises(sqs.exceptions.ClientError) as e:  # one running task per source
        sqs.start_message_move_task(SourceArn=dlq_arn)
    assert e.value.response["Error"]["Code"] == "InvalidParameterValue"
    (running,) = sqs.list_message_move_tasks(SourceArn=dlq_arn, MaxResults=10)["Results"]
    assert running["Status"] == "RUNNING" and running["TaskHandle"] == handle
    assert running["MaxNumberOfMessagesPerSecond"] == 1
    assert running["DestinationArn"] == _arn(sqs, other)
    moved = sqs.cancel_message_move_task(TaskHandle=handle)["ApproximateNumberOfMessagesMoved"]
    assert 0 <= moved < 6  # at one message a second, a 6-message move is still running
    (task,) = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert task["Status"] in ("CANCELLING", "CANCELLED")


def test_move_task_errors(sqs: Any, new_queue: Any) -> None:
    plain = new_queue()
    with pytest.raises(sqs.exceptions.ResourceNotFoundException):
        sqs.start_message_move_task(SourceArn="arn:aws:sqs:us-east-1:000000000000:nope-x")
    with pytest.raises(sqs.exceptions.ClientError) as e:  # not an Amazon-shaped handle
        sqs.cancel_message_move_task(TaskHandle="no-such-task")
    assert e.value.response["Error"]["Code"] == "InvalidParameterValue"
    with pytest.raises(sqs.exceptions.ClientError) as e:  # not a dead-letter queue
        sqs.start_message_move_task(SourceArn=_arn(sqs, plain))
    assert e.value.response["Error"]["Code"] == "InvalidParameterValue"
