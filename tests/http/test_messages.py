"""Messages over the SQS HTTP API with unmodified boto3: attributes and MD5s, batches with
partial failure, visibility, long polling, FIFO, and a consumer loop."""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

import pytest

ATTRS = {
    "color": {"DataType": "String", "StringValue": "blue ü"},
    "count": {"DataType": "Number", "StringValue": "42"},
    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xfe"},
    "trace": {"DataType": "String.custom", "StringValue": "t-1"},
}


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def test_send_receive_with_attributes_and_md5s(sqs: Any, new_queue: Any,
                                               attributes_md5: Any) -> None:
    url = new_queue()
    sent = sqs.send_message(QueueUrl=url, MessageBody="héllo", MessageAttributes=ATTRS)
    assert sent["MD5OfMessageBody"] == _md5("héllo")
    assert sent["MD5OfMessageAttributes"] == attributes_md5(ATTRS)
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"],
                              MessageSystemAttributeNames=["All"], WaitTimeSeconds=1)
    (m,) = got["Messages"]
    assert m["MessageId"] == sent["MessageId"] and m["Body"] == "héllo"
    assert m["MD5OfBody"] == _md5("héllo")
    assert m["MessageAttributes"] == ATTRS
    assert m["MD5OfMessageAttributes"] == attributes_md5(ATTRS)
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    assert int(m["Attributes"]["SentTimestamp"]) > 0
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def test_attribute_selection_and_legacy_attribute_names(sqs: Any, new_queue: Any,
                                                        attributes_md5: Any) -> None:
    url = new_queue()
    sqs.send_message(QueueUrl=url, MessageBody="b", MessageAttributes=ATTRS)
    # The older AttributeNames member and a selection of message attributes by name.
    # Queue attribute names are legal here and ignored, as SQS does.
    (m,) = sqs.receive_message(QueueUrl=url,
                               AttributeNames=["SentTimestamp", "Policy",
                                               "ApproximateNumberOfMessages"],
                               MessageAttributeNames=["color", "count"],
                               VisibilityTimeout=0)["Messages"]
    assert set(m["Attributes"]) == {"SentTimestamp"}
    want = {k: ATTRS[k] for k in ("color", "count")}
    assert m["MessageAttributes"] == want
    assert m["MD5OfMessageAttributes"] == attributes_md5(want)
    # kombu asks for everything as "ALL".
    (m,) = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["ALL"],
                               MessageAttributeNames=["ALL"], VisibilityTimeout=0)["Messages"]
    assert m["MessageAttributes"] == ATTRS and "SentTimestamp" in m["Attributes"]
    # Nothing asked for: neither member is present.
    (m,) = sqs.receive_message(QueueUrl=url)["Messages"]
    assert "Attributes" not in m and "MessageAttributes" not in m
    assert "MD5OfMessageAttributes" not in m
    with pytest.raises(sqs.exceptions.ClientError) as e:
        sqs.receive_message(QueueUrl=url, AttributeNames=["NoSuchAttribute"])
    assert e.value.response["Error"]["Code"] == "InvalidAttributeName"


def test_send_batch_partial_failure(sqs: Any, new_queue: Any) -> None:
    url = new_queue()
    result = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "ok1", "MessageBody": "one"},
        {"Id": "bad", "MessageBody": "two", "DelaySeconds": 5000},
        {"Id": "ok2", "MessageBody": "three"},
    ])
    assert sorted(e["Id"] for e in result["Successful"]) == ["ok1", "ok2"]
    assert all(e["MD5OfMessageBody"] for e in result["Successful"])
    (failed,) = result["Failed"]
    assert failed["Id"] == "bad" and failed["SenderFault"] is True
    assert failed["Code"] == "InvalidParameterValue" and failed["Message"]


def test_delete_and_change_visibility_batches(sqs: Any, new_queue: Any) -> None:
    url = new_queue()
    sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "MessageBody": f"m{i}"} for i in range(3)])
    msgs = []
    while len(msgs) < 3:
        msgs += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                    WaitTimeSeconds=1).get("Messages", [])
    changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "a", "ReceiptHandle": msgs[0]["ReceiptHandle"], "VisibilityTimeout": 60},
        {"Id": "b", "ReceiptHandle": "not-a-handle", "VisibilityTimeout": 60},
    ])
    assert [e["Id"] for e in changed["Successful"]] == ["a"]
    assert changed["Failed"][0]["Id"] == "b"
    assert changed["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(msgs)])
    assert sorted(e["Id"] for e in deleted["Successful"]) == ["d0", "d1", "d2"]
    assert "Failed" not in deleted  # left out when empty, as Amazon answers


def test_change_visibility_makes_message_visible_again(sqs: Any, new_queue: Any) -> None:
    url = new_queue(VisibilityTimeout="60")
    sqs.send_message(QueueUrl=url, MessageBody="again")
    (m,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                  VisibilityTimeout=0)
    (again,) = sqs.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"]
    assert again["MessageId"] == m["MessageId"]
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"
    # The first handle is superseded by the second receive.
    with pytest.raises(sqs.exceptions.ClientError):
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                      VisibilityTimeout=10)


def test_modeled_batch_and_message_errors(sqs: Any, new_queue: Any) -> None:
    url = new_queue()
    with pytest.raises(sqs.exceptions.TooManyEntriesInBatchRequest):
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "MessageBody": "x"} for i in range(11)])
    with pytest.raises(sqs.exceptions.EmptyBatchRequest):
        sqs.delete_message_batch(QueueUrl=url, Entries=[])
    with pytest.raises(sqs.exceptions.BatchEntryIdsNotDistinct):
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": "same", "MessageBody": "x"}, {"Id": "same", "MessageBody": "y"}])
    with pytest.raises(sqs.exceptions.InvalidBatchEntryId):
        sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "bad id!", "ReceiptHandle": "h"}])
    with pytest.raises(sqs.exceptions.BatchRequestTooLong):
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "MessageBody": "x" * 200_000} for i in range(6)])
    with pytest.raises(sqs.exceptions.InvalidMessageContents):
        sqs.send_message(QueueUrl=url, MessageBody="bad \x00 char")
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid) as e:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="forged")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=url + "-missing", MessageBody="x")
    # The request's shape is judged before the queue is looked up.
    with pytest.raises(sqs.exceptions.TooManyEntriesInBatchRequest):
        sqs.send_message_batch(QueueUrl=url + "-missing", Entries=[
            {"Id": str(i), "MessageBody": "x"} for i in range(11)])
    for bad in (0, 11):
        with pytest.raises(sqs.exceptions.ClientError) as e:
            sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=bad)
        assert e.value.response["Error"]["Code"] == "InvalidParameterValue"


def test_long_poll_wakes_on_send(sqs: Any, client_for: Any, sqs_endpoint: str,
                                 new_queue: Any) -> None:
    url = new_queue()
    other = client_for(sqs_endpoint)
    timer = threading.Timer(0.5, lambda: other.send_message(QueueUrl=url, MessageBody="late"))
    start = time.monotonic()
    timer.start()
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10)
    elapsed = time.monotonic() - start
    timer.join()
    assert got["Messages"][0]["Body"] == "late"
    assert elapsed < 5  # woken by the send, not by the end of the wait
    # An empty long poll waits out its time and returns no Messages member.
    start = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    assert time.monotonic() - start >= 0.9


def test_fifo_order_dedup_and_group_blocking(sqs: Any, new_queue: Any) -> None:
    url = new_queue("fifo", fifo=True)
    seqs = []
    for i in range(3):
        r = sqs.send_message(QueueUrl=url, MessageBody=f"a{i}", MessageGroupId="A",
                             MessageDeduplicationId=f"a{i}")
        seqs.append(int(r["SequenceNumber"]))
    assert seqs == sorted(seqs)
    dup = sqs.send_message(QueueUrl=url, MessageBody="a0", MessageGroupId="A",
                           MessageDeduplicationId="a0")
    sqs.send_message(QueueUrl=url, MessageBody="b0", MessageGroupId="B",
                     MessageDeduplicationId="b0")
    (first,) = sqs.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"]
    assert first["Body"] == "a0" and first["MessageId"] == dup["MessageId"]
    assert first["Attributes"]["MessageGroupId"] == "A"
    # Group A is blocked while a0 is in flight; only group B can be received.
    rest = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in rest] == ["b0"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    nxt = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in nxt] == ["a1", "a2"]
    with pytest.raises(sqs.exceptions.ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="no group")
    assert e.value.response["Error"]["Code"] == "MissingParameter"


def test_fifo_receive_request_attempt_id(sqs: Any, new_queue: Any) -> None:
    """A receive retried with its ReceiveRequestAttemptId gets the same messages and handles."""
    url = new_queue("attempt", fifo=True)
    for body in ("a0", "a1", "b0"):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=body[0],
                         MessageDeduplicationId=body)
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2,
                                ReceiveRequestAttemptId="attempt-1")["Messages"]
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2,
                                ReceiveRequestAttemptId="attempt-1")["Messages"]
    assert [m["Body"] for m in first] == ["a0", "a1"]
    assert [(m["MessageId"], m["ReceiptHandle"]) for m in again] == \
        [(m["MessageId"], m["ReceiptHandle"]) for m in first]
    other = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                ReceiveRequestAttemptId="attempt-2")["Messages"]
    assert [m["Body"] for m in other] == ["b0"]
    for m in first:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    with pytest.raises(sqs.exceptions.ClientError) as e:
        sqs.receive_message(QueueUrl=url, ReceiveRequestAttemptId="bad id ✗")
    assert e.value.response["Error"]["Code"] == "InvalidParameterValue"


def test_consumer_loop_receive_process_delete(sqs: Any, client_for: Any, sqs_endpoint: str,
                                              new_queue: Any) -> None:
    """A Celery/kombu-style worker: long-poll, process, delete; until the queue is drained."""
    url = new_queue("jobs", VisibilityTimeout="30")
    producer = client_for(sqs_endpoint)
    jobs = [f"job-{i}" for i in range(25)]
    for start in range(0, len(jobs), 10):
        producer.send_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "MessageBody": body,
             "MessageAttributes": {"task": {"DataType": "String", "StringValue": "add"}}}
            for i, body in enumerate(jobs[start:start + 10])])
    done: list[str] = []
    while True:
        resp = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                   MessageAttributeNames=["All"])
        batch = resp.get("Messages", [])
        if not batch:
            break
        for m in batch:
            assert m["MessageAttributes"]["task"]["StringValue"] == "add"
            done.append(m["Body"])  # "process"
        sqs.delete_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)])
    assert sorted(done) == sorted(jobs)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    assert attrs == {"ApproximateNumberOfMessages": "0",
                     "ApproximateNumberOfMessagesNotVisible": "0"}


def test_aws_trace_header_message_system_attribute(sqs: Any, new_queue: Any,
                                                   attributes_md5: Any) -> None:
    url = new_queue()
    trace = {"AWSTraceHeader": {"DataType": "String",
                                "StringValue": "Root=1-5759e988-bd862e3fe1be46a994272793"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="traced", MessageSystemAttributes=trace)
    assert sent["MD5OfMessageSystemAttributes"] == attributes_md5(trace)
    batch = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "t", "MessageBody": "also traced", "MessageSystemAttributes": trace},
        {"Id": "u", "MessageBody": "untraced"}])
    by_id = {s["Id"]: s for s in batch["Successful"]}
    assert by_id["t"]["MD5OfMessageSystemAttributes"] == attributes_md5(trace)
    assert "MD5OfMessageSystemAttributes" not in by_id["u"]
    got = []
    while len(got) < 3:
        got += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                   MessageSystemAttributeNames=["AWSTraceHeader"])["Messages"]
    headers = {m["Body"]: m.get("Attributes", {}).get("AWSTraceHeader") for m in got}
    value = trace["AWSTraceHeader"]["StringValue"]
    assert headers == {"traced": value, "also traced": value, "untraced": None}
    with pytest.raises(sqs.exceptions.ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageSystemAttributes={
            "SomethingElse": {"DataType": "String", "StringValue": "v"}})
    assert e.value.response["Error"]["Code"] == "InvalidParameterValue"


def test_a_lone_surrogate_is_refused_as_invalid_message_contents(
        sqs: Any, new_queue: Any) -> None:
    """JSON can carry a lone surrogate ("\\ud800"), which is no Unicode character: the
    request is refused with InvalidMessageContents at every door, nothing is sent."""
    url = new_queue()
    for call in (lambda: sqs.send_message_batch(QueueUrl=url, Entries=[
                     {"Id": "bad", "MessageBody": "half a pair \ud800"},
                     {"Id": "good", "MessageBody": "ok"}]),
                 lambda: sqs.send_message(QueueUrl=url, MessageBody="\udfff alone")):
        with pytest.raises(sqs.exceptions.InvalidMessageContents) as e:
            call()
        assert "surrogate" in e.value.response["Error"]["Message"]
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    # A pair is one character, and fine.
    sqs.send_message(QueueUrl=url, MessageBody="a pair \U0001F600")
    (m,) = sqs.receive_message(QueueUrl=url)["Messages"]
    assert m["Body"] == "a pair \U0001F600"
