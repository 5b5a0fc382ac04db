"""Dead-letter redrive end to end, and FIFO queues over a real server."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from sqsq.client import Client
from sqsq.errors import QueueError


def _arn(client: Client, url: str) -> str:
    return client.get_queue_attributes(url, ["QueueArn"])["QueueArn"]


# ---- dead-letter redrive -------------------------------------------------------------------


def test_dead_letter_redrive(client: Client, make_queue, depth) -> None:
    dlq = make_queue("dlq")
    policy = json.dumps({"deadLetterTargetArn": _arn(client, dlq), "maxReceiveCount": 2})
    src = make_queue("src", {"RedrivePolicy": policy})
    attrs = {"k": {"DataType": "String", "StringValue": "v"}}
    sent = client.send_message(src, "poison", message_attributes=attrs)

    for count in (1, 2):
        got = client.receive_message(src, visibility_timeout=0, attribute_names=["All"],
                                     wait_time_seconds=0)
        assert [m.message_id for m in got] == [sent.message_id]
        assert got[0].attributes["ApproximateReceiveCount"] == str(count)
    # The third receive finds the count at maxReceiveCount: the message moves instead.
    assert client.receive_message(src, visibility_timeout=0, wait_time_seconds=0) == []
    assert depth(client, src) == (0, 0, 0)
    assert depth(client, dlq) == (1, 0, 0)

    moved = client.receive_message(dlq, attribute_names=["All"], message_attribute_names=["All"],
                                   wait_time_seconds=0)
    assert len(moved) == 1
    m = moved[0]
    assert m.message_id == sent.message_id
    assert m.body == "poison"
    assert m.md5_of_body == hashlib.md5(b"poison").hexdigest()
    assert m.message_attributes == attrs
    assert m.attributes["DeadLetterQueueSourceArn"] == _arn(client, src)
    client.delete_message(dlq, m.receipt_handle)
    assert depth(client, dlq) == (0, 0, 0)


def test_redrive_leaves_messages_deleted_in_time(client: Client, make_queue, depth) -> None:
    dlq = make_queue("dlq")
    policy = json.dumps({"deadLetterTargetArn": _arn(client, dlq), "maxReceiveCount": 1})
    src = make_queue("src", {"RedrivePolicy": policy})
    client.send_message(src, "handled")
    m = client.receive_message(src, visibility_timeout=0)[0]
    client.delete_message(src, m.receipt_handle)
    assert client.receive_message(src, wait_time_seconds=0) == []
    assert depth(client, dlq) == (0, 0, 0)


def test_message_move_task_back_to_source(client: Client, make_queue, depth) -> None:
    dlq = make_queue("dlq")
    dlq_arn = _arn(client, dlq)
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})
    src = make_queue("src", {"RedrivePolicy": policy})
    sent = {client.send_message(src, f"m{i}").message_id for i in range(3)}
    while depth(client, dlq)[0] < 3:  # each message's second receive dead-letters it
        client.receive_message(src, 10, visibility_timeout=0, wait_time_seconds=0)
    # At one message a second the 3-message task runs for 3 s: the second start comes inside
    # it even on a slow machine (at 100 a second it could finish first, 30 ms later).
    handle = client.start_message_move_task(dlq_arn, max_number_of_messages_per_second=1)
    with pytest.raises(QueueError) as e:  # one running task per source queue
        client.start_message_move_task(dlq_arn)
    assert e.value.code == "InvalidParameterValue"
    deadline = time.monotonic() + 20
    while (task := client.list_message_move_tasks(dlq_arn)[0])["Status"] == "RUNNING":
        assert task["TaskHandle"] == handle and time.monotonic() < deadline
        time.sleep(0.1)  # polling a background task, not standing in for a clock
    assert task == {"Status": "COMPLETED", "SourceArn": dlq_arn,
                    "MaxNumberOfMessagesPerSecond": 1,
                    "ApproximateNumberOfMessagesMoved": 3,
                    "ApproximateNumberOfMessagesToMove": 3,
                    "StartedTimestamp": task["StartedTimestamp"]}
    back = client.receive_message(src, 10, wait_time_seconds=0)
    assert {m.message_id for m in back} == sent  # the same MessageIds, in the source again
    with pytest.raises(QueueError) as e:
        client.cancel_message_move_task(handle)  # finished: nothing to cancel
    assert e.value.code == "ResourceNotFoundException"


def test_fifo_dead_letter_redrive(client: Client, make_queue) -> None:
    dlq = make_queue("fdlq", fifo=True)
    policy = json.dumps({"deadLetterTargetArn": _arn(client, dlq), "maxReceiveCount": 1})
    src = make_queue("fsrc", {"RedrivePolicy": policy}, fifo=True)
    sent = client.send_message(src, "bad", message_group_id="g", message_deduplication_id="d1")
    first = client.receive_message(src, visibility_timeout=0)
    assert [m.message_id for m in first] == [sent.message_id]
    assert client.receive_message(src, visibility_timeout=0, wait_time_seconds=0) == []
    moved = client.receive_message(dlq, attribute_names=["All"])
    assert [m.message_id for m in moved] == [sent.message_id]
    assert moved[0].attributes["DeadLetterQueueSourceArn"] == _arn(client, src)
    assert moved[0].attributes["MessageGroupId"] == "g"


# ---- FIFO ----------------------------------------------------------------------------------


def test_fifo_order_within_group_and_sequence_numbers(client: Client, make_queue) -> None:
    url = make_queue("order", fifo=True)
    attrs = client.get_queue_attributes(url)
    assert attrs["FifoQueue"] == "true"
    assert attrs["ContentBasedDeduplication"] == "false"
    sent = [
        client.send_message(url, f"a{i}", message_group_id="A", message_deduplication_id=f"a{i}")
        for i in range(5)
    ]
    seqs = [int(s.sequence_number) for s in sent]  # type: ignore[arg-type]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    got = client.receive_message(url, max_number_of_messages=10, attribute_names=["All"])
    assert [m.body for m in got] == [f"a{i}" for i in range(5)]
    assert [m.attributes["SequenceNumber"] for m in got] == [s.sequence_number for s in sent]
    assert all(m.attributes["MessageGroupId"] == "A" for m in got)
    assert [m.attributes["MessageDeduplicationId"] for m in got] == [f"a{i}" for i in range(5)]
    for m in got:
        client.delete_message(url, m.receipt_handle)


def test_fifo_group_blocks_while_in_flight(client: Client, make_queue) -> None:
    url = make_queue("block", fifo=True)
    for i in range(3):
        client.send_message(url, f"a{i}", message_group_id="A", message_deduplication_id=f"a{i}")
    for i in range(2):
        client.send_message(url, f"b{i}", message_group_id="B", message_deduplication_id=f"b{i}")

    first = client.receive_message(url, max_number_of_messages=1, visibility_timeout=30)
    assert [m.body for m in first] == ["a0"]
    # Group A is blocked while a0 is in flight; B is free.
    nxt = client.receive_message(url, max_number_of_messages=10, visibility_timeout=30,
                                 wait_time_seconds=0)
    assert [m.body for m in nxt] == ["b0", "b1"]
    assert client.receive_message(url, max_number_of_messages=10, wait_time_seconds=0) == []
    client.delete_message(url, first[0].receipt_handle)
    # Unblocked: the rest of A in order.
    rest = client.receive_message(url, max_number_of_messages=10, wait_time_seconds=0)
    assert [m.body for m in rest] == ["a1", "a2"]


def test_fifo_receive_request_attempt_id(client: Client, make_queue) -> None:
    url = make_queue("attempt", fifo=True)
    for i in range(2):
        client.send_message(url, f"a{i}", message_group_id="A", message_deduplication_id=f"a{i}")
    first = client.receive_message(url, 10, receive_request_attempt_id="retry-me",
                                   wait_time_seconds=0)
    again = client.receive_message(url, 10, receive_request_attempt_id="retry-me",
                                   wait_time_seconds=0)
    assert [m.body for m in first] == ["a0", "a1"]
    assert [m.receipt_handle for m in again] == [m.receipt_handle for m in first]
    client.delete_message_batch(url, [{"Id": str(i), "ReceiptHandle": m.receipt_handle}
                                      for i, m in enumerate(first)])
    assert client.get_queue_attributes(url, ["ApproximateNumberOfMessagesNotVisible"]) == \
        {"ApproximateNumberOfMessagesNotVisible": "0"}


def test_fifo_visibility_return_keeps_order(client: Client, make_queue) -> None:
    url = make_queue("redeliver", fifo=True)
    for i in range(3):
        client.send_message(url, f"m{i}", message_group_id="G", message_deduplication_id=f"m{i}")
    got = client.receive_message(url, max_number_of_messages=2)
    assert [m.body for m in got] == ["m0", "m1"]
    client.change_message_visibility(url, got[0].receipt_handle, 0)
    client.change_message_visibility(url, got[1].receipt_handle, 0)
    again = client.receive_message(url, max_number_of_messages=10, attribute_names=["All"])
    assert [m.body for m in again] == ["m0", "m1", "m2"]
    assert [m.attributes["ApproximateReceiveCount"] for m in again] == ["2", "2", "1"]


def test_fifo_deduplication_returns_first_message_id(client: Client, make_queue, depth) -> None:
    url = make_queue("dedup", fifo=True)
    first = client.send_message(url, "once", message_group_id="g", message_deduplication_id="x")
    dup = client.send_message(url, "once more", message_group_id="g",
                              message_deduplication_id="x")
    assert dup.message_id == first.message_id
    assert dup.sequence_number == first.sequence_number
    assert depth(client, url) == (1, 0, 0)
    got = client.receive_message(url, max_number_of_messages=10)
    assert [m.body for m in got] == ["once"]
    client.delete_message(url, got[0].receipt_handle)
    # The window outlives the deletion: still a duplicate, not delivered again.
    again = client.send_message(url, "once", message_group_id="g", message_deduplication_id="x")
    assert again.message_id == first.message_id
    assert client.receive_message(url, wait_time_seconds=0) == []


def test_fifo_content_based_deduplication(client: Client, make_queue, depth) -> None:
    url = make_queue("cbd", {"ContentBasedDeduplication": "true"}, fifo=True)
    a = client.send_message(url, "same body", message_group_id="g1")
    b = client.send_message(url, "same body", message_group_id="g2")
    c = client.send_message(url, "other body", message_group_id="g1")
    assert a.message_id == b.message_id
    assert c.message_id != a.message_id
    assert depth(client, url) == (2, 0, 0)
    got = client.receive_message(url, max_number_of_messages=10, attribute_names=["All"])
    assert [m.body for m in got] == ["same body", "other body"]
    assert got[0].attributes["MessageDeduplicationId"] == hashlib.sha256(
        b"same body").hexdigest()


def test_fifo_batch_send_keeps_order(client: Client, make_queue) -> None:
    url = make_queue("fbatch", fifo=True)
    result = client.send_message_batch(url, [
        {"Id": f"e{i}", "MessageBody": f"m{i}", "MessageGroupId": "G",
         "MessageDeduplicationId": f"d{i}"}
        for i in range(10)
    ])
    assert result.ok
    seqs = [int(s.sequence_number) for s in result.successful]
    assert seqs == sorted(seqs)
    got = client.receive_message(url, max_number_of_messages=10)
    assert [m.body for m in got] == [f"m{i}" for i in range(10)]


def test_fifo_rejects_per_message_delay(client: Client, make_queue) -> None:
    url = make_queue("fdelay", fifo=True)
    with pytest.raises(QueueError) as e:
        client.send_message(url, "x", delay_seconds=1, message_group_id="g",
                            message_deduplication_id="d")
    assert e.value.code == "InvalidParameterValue"
    assert client.receive_message(url, wait_time_seconds=0) == []


def test_fifo_purge_clears_deduplication(client: Client, make_queue) -> None:
    """As Amazon SQS was recorded doing: after PurgeQueue a deduplication id used before the
    purge sends a new message."""
    url = make_queue("fpurge", fifo=True)
    first = client.send_message(url, "x", message_group_id="g", message_deduplication_id="d")
    client.purge_queue(url)
    again = client.send_message(url, "x", message_group_id="g", message_deduplication_id="d")
    assert again.message_id != first.message_id
    assert [m.message_id for m in client.receive_message(url)] == [again.message_id]


def test_fifo_group_unblocks_when_visibility_times_out(client: Client, make_queue) -> None:
    url = make_queue("funblock", fifo=True)
    for i in range(2):
        client.send_message(url, f"m{i}", message_group_id="G", message_deduplication_id=f"{i}")
    held = client.receive_message(url, visibility_timeout=1)
    assert [m.body for m in held] == ["m0"]
    assert client.receive_message(url, wait_time_seconds=0) == []
    # The long poll wakes when m0's timeout ends; m0 comes first again, not m1.
    got = client.receive_message(url, max_number_of_messages=10, wait_time_seconds=4,
                                 attribute_names=["ApproximateReceiveCount"])
    assert [m.body for m in got] == ["m0", "m1"]
    assert got[0].attributes["ApproximateReceiveCount"] == "2"
