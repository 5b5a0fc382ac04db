"""Answers recorded against Amazon SQS itself, checked in both protocols (``wire``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

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
