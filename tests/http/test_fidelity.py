"""Answers recorded against Amazon SQS itself, checked in both protocols (``wire``)."""

from __future__ import annotations

import base64
import json
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import pytest

from sqswire import Failed, Wire, signed_query, xml_text


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


# ---- the smaller ones ------------------------------------------------------------------------


def test_trace_header_becomes_aws_trace_header(wire: Wire, new_queue: Callable[..., str]) -> None:
    url = new_queue()
    trace = "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"
    sent = wire("SendMessage", QueueUrl=url, MessageBody="t", headers={"X-Amzn-Trace-Id": trace})
    assert sent["MD5OfMessageSystemAttributes"]
    (m,) = wire("ReceiveMessage", QueueUrl=url, MessageSystemAttributeNames=["All"])["Messages"]
    assert m["Attributes"]["AWSTraceHeader"] == trace


def test_wait_time_seconds_message(wire: Wire, new_queue: Callable[..., str]) -> None:
    url = new_queue()
    with pytest.raises(Failed) as e:
        wire("ReceiveMessage", QueueUrl=url, WaitTimeSeconds=21)
    assert (e.value.status, e.value.code, e.value.message) == (
        400, "InvalidParameterValue",
        "Value 21 for parameter WaitTimeSeconds is invalid. Reason: Must be >= 0 and <= 20, "
        "if provided.")


def test_message_attribute_selection_and_unicode_names(
        wire: Wire, new_queue: Callable[..., str]) -> None:
    url = new_queue()
    attrs = {name: {"DataType": "String", "StringValue": name}
             for name in ("X.a", "X.b", "Y", "Zähler_名前-1")}
    wire("SendMessage", QueueUrl=url, MessageBody="m", MessageAttributes=attrs)
    (m,) = wire("ReceiveMessage", QueueUrl=url, VisibilityTimeout=0,
                MessageAttributeNames=["*"])["Messages"]
    assert sorted(m["MessageAttributes"]) == sorted(attrs)
    (m,) = wire("ReceiveMessage", QueueUrl=url, VisibilityTimeout=0,
                MessageAttributeNames=["X.*"])["Messages"]
    assert sorted(m["MessageAttributes"]) == ["X.a", "X.b"]


def test_queue_attribute_answers(wire: Wire, new_queue: Callable[..., str]) -> None:
    url = new_queue()
    arn = _arn(wire, url)
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 2})
    wire("SetQueueAttributes", QueueUrl=url, Attributes={"RedrivePolicy": policy})  # itself
    wire("SetQueueAttributes", QueueUrl=url, Attributes={"KmsDataKeyReusePeriodSeconds": "300"})
    got = wire("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert json.loads(got["RedrivePolicy"])["deadLetterTargetArn"] == arn
    assert "KmsDataKeyReusePeriodSeconds" not in got  # only while a KMS key is set
    wire("SetQueueAttributes", QueueUrl=url, Attributes={"KmsMasterKeyId": "alias/aws/sqs"})
    got = wire("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert got["KmsDataKeyReusePeriodSeconds"] == "300"


def test_deduplication_scope_works_as_created(wire: Wire, new_queue: Callable[..., str]) -> None:
    url = new_queue(fifo=True)  # DeduplicationScope "queue"
    wire("SetQueueAttributes", QueueUrl=url, Attributes={"DeduplicationScope": "messageGroup"})
    assert wire("GetQueueAttributes", QueueUrl=url, AttributeNames=["DeduplicationScope"])[
        "Attributes"]["DeduplicationScope"] == "messageGroup"
    a = wire("SendMessage", QueueUrl=url, MessageBody="x", MessageGroupId="A",
             MessageDeduplicationId="d")
    b = wire("SendMessage", QueueUrl=url, MessageBody="x", MessageGroupId="B",
             MessageDeduplicationId="d")
    assert a["MessageId"] == b["MessageId"]  # still deduplicated across groups


def test_json_batch_result_leaves_out_empty_failed(wire: Wire,
                                                   new_queue: Callable[..., str]) -> None:
    url = new_queue()
    result = wire("SendMessageBatch", QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "a"}])
    assert [s["Id"] for s in result["Successful"]] == ["a"] and "Failed" not in result


def test_timed_out_message_goes_back_to_its_place(wire: Wire,
                                                  new_queue: Callable[..., str]) -> None:
    url = new_queue()
    for body in ("first", "second"):
        wire("SendMessage", QueueUrl=url, MessageBody=body)
    (m,) = wire("ReceiveMessage", QueueUrl=url)["Messages"]
    assert m["Body"] == "first"
    wire("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
         VisibilityTimeout=0)
    (again,) = wire("ReceiveMessage", QueueUrl=url)["Messages"]
    assert again["Body"] == "first"  # ahead of "second", which was sent after it


def test_fifo_sequence_numbers_look_like_amazons(wire: Wire,
                                                 new_queue: Callable[..., str]) -> None:
    url = new_queue(fifo=True, ContentBasedDeduplication="true")
    seqs = [wire("SendMessage", QueueUrl=url, MessageBody=b, MessageGroupId="g")[
        "SequenceNumber"] for b in ("a", "b")]
    assert all(len(s) == 20 and s[0] != "0" for s in seqs)
    assert int(seqs[0]) < int(seqs[1])


def test_query_protocol_answers(sqs_endpoint: str, new_queue: Callable[..., str]) -> None:
    url = new_queue()
    status, root = signed_query(sqs_endpoint, {"Action": "GetQueueUrl",
                                               "QueueName": "no-such-queue-x"})
    assert (status, xml_text(root, "sqs:Error/sqs:Code")) == (
        400, "AWS.SimpleQueueService.NonExistentQueue")
    assert xml_text(root, "sqs:Error/sqs:Message") == \
        "The specified queue does not exist for this wsdl version."
    status, root = signed_query(url, {})
    assert (status, root.tag) == (404, "UnknownOperationException")
    for action in ("CreateQueue", "ListQueues"):
        status, root = signed_query(url, {"Action": action, "QueueName": "x"})
        assert (status, xml_text(root, "sqs:Error/sqs:Code"),
                xml_text(root, "sqs:Error/sqs:Message")) == (
            400, "InvalidAction", f"The action {action} is not valid for this endpoint.")
    body = urlencode({"Action": "GetQueueAttributes", "QueueUrl": url,
                      "AttributeName.1": "VisibilityTimeout"}).encode()
    req = urllib.request.Request(sqs_endpoint, data=body, method="POST", headers={
        "Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        doc = json.loads(resp.read())
    result = doc["GetQueueAttributesResponse"]["GetQueueAttributesResult"]
    assert result["Attributes"] == {"VisibilityTimeout": "30"}


def test_fifo_blocking_is_per_message(wire: Wire, new_queue: Callable[..., str]) -> None:
    """An older message of a group visible again (here: visibility set to 0) is received again
    while later ones of the group are in flight."""
    url = new_queue(fifo=True, ContentBasedDeduplication="true")
    for body in ("a1", "a2"):
        wire("SendMessage", QueueUrl=url, MessageBody=body, MessageGroupId="A")
    m1, m2 = wire("ReceiveMessage", QueueUrl=url, MaxNumberOfMessages=10,
                  VisibilityTimeout=60)["Messages"]
    assert (m1["Body"], m2["Body"]) == ("a1", "a2")
    wire("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=m1["ReceiptHandle"],
         VisibilityTimeout=0)
    (again,) = wire("ReceiveMessage", QueueUrl=url, MaxNumberOfMessages=10,
                    AttributeNames=["ApproximateReceiveCount"])["Messages"]
    assert again["Body"] == "a1" and again["Attributes"]["ApproximateReceiveCount"] == "2"


def test_add_and_remove_permission(wire: Wire, new_queue: Callable[..., str]) -> None:
    url = new_queue()
    arn = _arn(wire, url)

    def policy() -> dict[str, Any] | None:
        got = wire("GetQueueAttributes", QueueUrl=url, AttributeNames=["Policy"])
        raw = got.get("Attributes", {}).get("Policy")
        return json.loads(raw) if raw else None

    wire("AddPermission", QueueUrl=url, Label="one", AWSAccountIds=["111122223333"],
         Actions=["SendMessage"])
    wire("AddPermission", QueueUrl=url, Label="two",
         AWSAccountIds=["111122223333", "444455556666"], Actions=["ReceiveMessage", "*"])
    assert policy() == {
        "Version": "2008-10-17", "Id": f"{arn}/SQSDefaultPolicy", "Statement": [
            {"Sid": "one", "Effect": "Allow",
             "Principal": {"AWS": "arn:aws:iam::111122223333:root"},
             "Action": "SQS:SendMessage", "Resource": arn},
            {"Sid": "two", "Effect": "Allow",
             "Principal": {"AWS": ["arn:aws:iam::111122223333:root",
                                   "arn:aws:iam::444455556666:root"]},
             "Action": ["SQS:ReceiveMessage", "SQS:*"], "Resource": arn}]}
    with pytest.raises(Failed) as e:
        wire("AddPermission", QueueUrl=url, Label="one", AWSAccountIds=["111122223333"],
             Actions=["SendMessage"])
    assert (e.value.status, e.value.code, e.value.message) == (
        400, "InvalidParameterValue",
        "Value one for parameter Label is invalid. Reason: Already exists.")
    wire("RemovePermission", QueueUrl=url, Label="one")
    assert [s["Sid"] for s in policy()["Statement"]] == ["two"]
    with pytest.raises(Failed) as e:
        wire("RemovePermission", QueueUrl=url, Label="one")
    assert (e.value.status, e.value.code, e.value.message) == (
        400, "InvalidParameterValue",
        "Value one for parameter Label is invalid. Reason: can't find label.")
    wire("RemovePermission", QueueUrl=url, Label="two")
    assert policy() is None  # the Policy attribute is gone when its last statement is


def test_over_size_requests_are_sqs_errors(sqs_endpoint: str) -> None:
    """A body declared over the limit is refused at once with an SQS error, in the caller's
    protocol, not aiohttp's plain-text 413 (and nothing waits for the body)."""
    import http.client
    from urllib.parse import urlsplit

    host = urlsplit(sqs_endpoint)
    for headers, parse in (
        ({"X-Amz-Target": "AmazonSQS.ListQueues",
          "Content-Type": "application/x-amz-json-1.0"}, "json"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, "query"),
    ):
        conn = http.client.HTTPConnection(host.hostname, host.port, timeout=10)
        conn.putrequest("POST", "/")
        for k, v in {**headers, "Content-Length": str(5 * 1024 * 1024)}.items():
            conn.putheader(k, v)
        conn.endheaders()
        resp = conn.getresponse()
        body = resp.read().decode()
        conn.close()
        assert resp.status == 400, body
        if parse == "json":
            assert json.loads(body)["__type"].endswith("#InvalidParameterValueException")
            assert resp.getheader("x-amzn-query-error") == "InvalidParameterValue;Sender"
        else:
            assert "<Code>InvalidParameterValue</Code>" in body
        assert "shorter than 1048576 bytes" in body
