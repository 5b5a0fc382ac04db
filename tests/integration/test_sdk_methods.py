"""Every SDK method against a real ``sqsq server`` over gRPC, checking what a user sees."""

from __future__ import annotations

import hashlib
import time
import uuid

import pytest

from sqsq.client import Client, Message, SendResult
from sqsq.client.types import BatchResultEntry, SendBatchResultEntry
from sqsq.errors import QueueError

ACCOUNT = "000000000000"


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8")).hexdigest()


def name_of(url: str) -> str:
    return url.rsplit("/", 1)[-1]


# ---- queues --------------------------------------------------------------------------------


def test_create_queue_returns_url_and_is_idempotent(client: Client, door) -> None:
    name = unique_name("create")
    url = client.create_queue(name, attributes={"VisibilityTimeout": "45"})
    assert url == f"{door.http_url}/{ACCOUNT}/{name}"
    # Same attributes again: the same queue, no error.
    assert client.create_queue(name, attributes={"VisibilityTimeout": "45"}) == url
    # No attributes named: also the existing queue.
    assert client.create_queue(name) == url
    assert client.get_queue_url(name) == url
    assert client.get_queue_attributes(url, ["VisibilityTimeout"]) == {"VisibilityTimeout": "45"}


def test_queue_name_or_url_both_address_a_queue(client: Client, make_queue) -> None:
    url = make_queue()
    sent = client.send_message(name_of(url), "by name")
    got = client.receive_message(url, wait_time_seconds=0)
    assert [m.message_id for m in got] == [sent.message_id]
    client.delete_message(name_of(url), got[0].receipt_handle)
    assert client.receive_message(url, wait_time_seconds=0) == []


def test_list_queues_prefix_and_pagination(client: Client) -> None:
    prefix = unique_name("list")
    names = [f"{prefix}-{i}" for i in range(5)]
    urls = [client.create_queue(n) for n in names]
    other = client.create_queue(unique_name("other"))

    listed = client.list_queues(prefix)
    assert listed == sorted(urls)
    assert other not in listed
    assert set(urls) <= set(client.list_queues())

    pages: list[list[str]] = []
    token: str | None = None
    while True:
        page, token = client.list_queues_page(prefix, max_results=2, next_token=token)
        pages.append(page)
        if token is None:
            break
        assert len(pages) < 10, "pagination does not end"
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [u for p in pages for u in p] == sorted(urls)
    # ``list_queues`` with max_results gives the first page only.
    assert client.list_queues(prefix, max_results=3) == sorted(urls)[:3]
    assert client.list_queues(unique_name("nothing-has-this-prefix")) == []


def test_delete_queue(client: Client, make_queue) -> None:
    url = make_queue("del")
    client.send_message(url, "doomed")
    client.delete_queue(url)
    with pytest.raises(QueueError) as e:
        client.get_queue_url(name_of(url))
    assert e.value.code == "QueueDoesNotExist"
    assert url not in client.list_queues(name_of(url))
    with pytest.raises(QueueError) as e:
        client.send_message(url, "after delete")
    assert e.value.code == "QueueDoesNotExist"


def test_purge_queue(client: Client, make_queue, depth) -> None:
    url = make_queue("purge")
    for i in range(3):
        client.send_message(url, f"m{i}")
    client.receive_message(url, visibility_timeout=30)  # one in flight: purged as well
    assert depth(client, url) == (2, 1, 0)
    client.purge_queue(url)
    assert depth(client, url) == (0, 0, 0)
    assert client.receive_message(url, max_number_of_messages=10, wait_time_seconds=0) == []
    # The queue itself lives on and takes new messages.
    sent = client.send_message(url, "after purge")
    assert [m.message_id for m in client.receive_message(url)] == [sent.message_id]


def test_get_queue_attributes_defaults_are_strings(client: Client) -> None:
    name = unique_name("attrs")
    before = int(time.time())
    url = client.create_queue(name)
    after = int(time.time())
    attrs = client.get_queue_attributes(url)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in attrs.items())
    assert attrs["VisibilityTimeout"] == "30"
    assert attrs["DelaySeconds"] == "0"
    assert attrs["MessageRetentionPeriod"] == "345600"
    assert attrs["MaximumMessageSize"] == "1048576"
    assert attrs["ReceiveMessageWaitTimeSeconds"] == "0"
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "0"
    assert attrs["ApproximateNumberOfMessagesDelayed"] == "0"
    assert attrs["QueueArn"].startswith("arn:aws:sqs:")
    assert attrs["QueueArn"].endswith(f":{ACCOUNT}:{name}")
    # Epoch seconds, not milliseconds.
    assert before - 5 <= int(attrs["CreatedTimestamp"]) <= after + 5
    assert int(attrs["LastModifiedTimestamp"]) >= int(attrs["CreatedTimestamp"])
    assert "FifoQueue" not in attrs
    assert "RedrivePolicy" not in attrs
    # Named attributes: just those.
    assert client.get_queue_attributes(url, ["DelaySeconds", "QueueArn"]) == {
        "DelaySeconds": "0", "QueueArn": attrs["QueueArn"],
    }
    assert client.get_queue_attributes(url, "VisibilityTimeout") == {"VisibilityTimeout": "30"}


def test_set_queue_attributes(client: Client, make_queue) -> None:
    url = make_queue("setattrs")
    client.set_queue_attributes(url, {
        "VisibilityTimeout": "120",
        "DelaySeconds": "2",
        "MaximumMessageSize": "2048",
        "MessageRetentionPeriod": "3600",
        "ReceiveMessageWaitTimeSeconds": "3",
    })
    attrs = client.get_queue_attributes(url)
    assert attrs["VisibilityTimeout"] == "120"
    assert attrs["DelaySeconds"] == "2"
    assert attrs["MaximumMessageSize"] == "2048"
    assert attrs["MessageRetentionPeriod"] == "3600"
    assert attrs["ReceiveMessageWaitTimeSeconds"] == "3"
    # The queue's DelaySeconds applies to a send that names none.
    client.send_message(url, "late")
    assert client.get_queue_attributes(url, ["ApproximateNumberOfMessagesDelayed"]) == {
        "ApproximateNumberOfMessagesDelayed": "1"
    }


def test_tags(client: Client) -> None:
    url = client.create_queue(unique_name("tags"), tags={"team": "core", "env": "test"})
    assert client.list_queue_tags(url) == {"team": "core", "env": "test"}
    client.tag_queue(url, {"env": "prod", "owner": "me"})
    assert client.list_queue_tags(url) == {"team": "core", "env": "prod", "owner": "me"}
    client.untag_queue(url, ["team", "not-there"])
    assert client.list_queue_tags(url) == {"env": "prod", "owner": "me"}
    client.untag_queue(url, "env")
    assert client.list_queue_tags(url) == {"owner": "me"}


def test_list_dead_letter_source_queues(client: Client, make_queue) -> None:
    dlq = make_queue("dlq")
    dlq_arn = client.get_queue_attributes(dlq, ["QueueArn"])["QueueArn"]
    assert client.list_dead_letter_source_queues(dlq) == []
    policy = f'{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"3"}}'
    src1 = make_queue("src", {"RedrivePolicy": policy})
    src2 = make_queue("src")
    client.set_queue_attributes(src2, {"RedrivePolicy": policy})
    make_queue("bystander")
    assert sorted(client.list_dead_letter_source_queues(dlq)) == sorted([src1, src2])
    got = client.get_queue_attributes(src1, ["RedrivePolicy"])["RedrivePolicy"]
    assert dlq_arn in got and "3" in got


# ---- messages ------------------------------------------------------------------------------

ATTRS = {
    "text": {"DataType": "String", "StringValue": "héllo wörld"},
    "count": {"DataType": "Number", "StringValue": "42.5"},
    "blob": {"DataType": "Binary", "BinaryValue": bytes(range(256))},
    "label": {"DataType": "String.custom", "StringValue": "x"},
}


def test_send_and_receive_with_attributes(client: Client, make_queue) -> None:
    url = make_queue("send")
    body = "hello, wörld ✓ 𝄞 \t\n\r"
    before_ms = int(time.time() * 1000)
    sent = client.send_message(url, body, message_attributes=ATTRS)
    assert isinstance(sent, SendResult)
    assert sent.message_id
    assert sent.md5_of_message_body == md5(body)
    assert sent.md5_of_message_attributes and len(sent.md5_of_message_attributes) == 32
    assert sent.sequence_number is None

    got = client.receive_message(
        url, attribute_names=["All"], message_attribute_names=["All"], wait_time_seconds=0
    )
    after_ms = int(time.time() * 1000)
    assert len(got) == 1
    m = got[0]
    assert isinstance(m, Message)
    assert m.message_id == sent.message_id
    assert m.body == body
    assert m.md5_of_body == md5(body)
    assert m.md5_of_message_attributes == sent.md5_of_message_attributes
    assert m.message_attributes == ATTRS
    assert isinstance(m.message_attributes["blob"]["BinaryValue"], bytes)
    assert all(isinstance(v, str) for v in m.attributes.values())
    assert m.attributes["ApproximateReceiveCount"] == "1"
    assert m.receive_count == 1
    sent_ts = int(m.attributes["SentTimestamp"])
    first_ts = int(m.attributes["ApproximateFirstReceiveTimestamp"])
    assert before_ms - 5000 <= sent_ts <= first_ts <= after_ms + 5000
    assert m.receipt_handle


def test_receive_selects_requested_attributes(client: Client, make_queue) -> None:
    url = make_queue("select")
    client.send_message(url, "x", message_attributes=ATTRS)
    m = client.receive_message(url, visibility_timeout=0, wait_time_seconds=0)[0]
    # Nothing asked for: no attributes of either kind.
    assert m.attributes == {}
    assert m.message_attributes == {}
    assert m.md5_of_body == md5("x")
    m = client.receive_message(
        url, visibility_timeout=0, attribute_names=["ApproximateReceiveCount"],
        message_attribute_names=["text", "blob"], wait_time_seconds=0,
    )[0]
    assert m.attributes == {"ApproximateReceiveCount": "2"}
    assert m.message_attributes == {"text": ATTRS["text"], "blob": ATTRS["blob"]}
    m = client.receive_message(
        url, visibility_timeout=0, message_attribute_names=[".*"],
        message_system_attribute_names=["SentTimestamp"], wait_time_seconds=0,
    )[0]
    assert set(m.attributes) == {"SentTimestamp"}
    assert m.message_attributes == ATTRS


def test_receive_count_grows_and_receipt_handles_change(client: Client, make_queue) -> None:
    url = make_queue("count")
    sent = client.send_message(url, "again and again")
    handles = []
    for expected in (1, 2, 3):
        got = client.receive_message(url, visibility_timeout=0, attribute_names=["All"],
                                     wait_time_seconds=0)
        assert [m.message_id for m in got] == [sent.message_id]
        assert got[0].attributes["ApproximateReceiveCount"] == str(expected)
        handles.append(got[0].receipt_handle)
    assert len(set(handles)) == 3
    client.delete_message(url, handles[-1])
    assert client.receive_message(url, wait_time_seconds=0) == []


def test_receive_many_and_visibility(client: Client, make_queue, depth) -> None:
    url = make_queue("many")
    ids = {client.send_message(url, f"m{i}").message_id for i in range(15)}
    first = client.receive_message(url, max_number_of_messages=10, wait_time_seconds=0)
    assert len(first) == 10
    rest = client.receive_message(url, max_number_of_messages=10, wait_time_seconds=0)
    assert len(rest) == 5
    assert {m.message_id for m in first + rest} == ids
    assert depth(client, url) == (0, 15, 0)
    # All in flight for the queue's 30 s: nothing more to receive.
    assert client.receive_message(url, max_number_of_messages=10, wait_time_seconds=0) == []


def test_send_message_batch(client: Client, make_queue) -> None:
    url = make_queue("sendbatch")
    entries = [
        {"Id": "a", "MessageBody": "first"},
        {"Id": "b-2", "MessageBody": "second", "MessageAttributes": {
            "k": {"DataType": "String", "StringValue": "v"}}},
        {"Id": "c_3", "MessageBody": "third", "DelaySeconds": 0},
    ]
    result = client.send_message_batch(url, entries)
    assert result.ok and result.failed == []
    assert all(isinstance(s, SendBatchResultEntry) for s in result.successful)
    by_id = {s.id: s for s in result.successful}
    assert set(by_id) == {"a", "b-2", "c_3"}
    for e in entries:
        assert by_id[e["Id"]].md5_of_message_body == md5(e["MessageBody"])
    assert by_id["b-2"].md5_of_message_attributes
    assert by_id["a"].md5_of_message_attributes is None
    assert len({s.message_id for s in result.successful}) == 3

    got = client.receive_message(url, max_number_of_messages=10, message_attribute_names=["All"],
                                 wait_time_seconds=0)
    assert {m.message_id: m.body for m in got} == {
        by_id[e["Id"]].message_id: e["MessageBody"] for e in entries
    }
    second = next(m for m in got if m.body == "second")
    assert second.message_attributes == {"k": {"DataType": "String", "StringValue": "v"}}


def test_send_message_batch_partial_failure(client: Client, make_queue, depth) -> None:
    url = make_queue("partial")
    result = client.send_message_batch(url, [
        {"Id": "good", "MessageBody": "fine"},
        {"Id": "bad", "MessageBody": "nul \x00 byte"},
        {"Id": "late", "MessageBody": "too late", "DelaySeconds": 901},
    ])
    assert [s.id for s in result.successful] == ["good"]
    failed = {f.id: f for f in result.failed}
    assert set(failed) == {"bad", "late"}
    assert failed["bad"].code == "InvalidMessageContents"
    assert failed["late"].code == "InvalidParameterValue"
    assert failed["bad"].sender_fault and failed["bad"].message
    assert depth(client, url) == (1, 0, 0)
    got = client.receive_message(url, max_number_of_messages=10, wait_time_seconds=0)
    assert [m.body for m in got] == ["fine"]


def test_delete_message(client: Client, make_queue, depth) -> None:
    url = make_queue("delete")
    client.send_message(url, "bye")
    m = client.receive_message(url)[0]
    assert depth(client, url) == (0, 1, 0)
    client.delete_message(url, m.receipt_handle)
    assert depth(client, url) == (0, 0, 0)
    # Repeating a delete of a deleted message succeeds.
    client.delete_message(url, m.receipt_handle)


def test_delete_message_batch(client: Client, make_queue, depth) -> None:
    url = make_queue("delbatch")
    client.send_message_batch(url, [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(4)])
    got = client.receive_message(url, max_number_of_messages=10, wait_time_seconds=0)
    assert len(got) == 4
    entries = [{"Id": f"e{i}", "ReceiptHandle": m.receipt_handle} for i, m in enumerate(got[:3])]
    entries.append({"Id": "garbled", "ReceiptHandle": "not-a-handle"})
    result = client.delete_message_batch(url, entries)
    assert sorted(s.id for s in result.successful) == ["e0", "e1", "e2"]
    assert all(isinstance(s, BatchResultEntry) for s in result.successful)
    assert [(f.id, f.code) for f in result.failed] == [("garbled", "ReceiptHandleIsInvalid")]
    assert depth(client, url) == (0, 1, 0)
    client.delete_message(url, got[3].receipt_handle)
    assert depth(client, url) == (0, 0, 0)


def test_change_message_visibility(client: Client, make_queue, depth) -> None:
    url = make_queue("chvis")
    sent = client.send_message(url, "peek")
    m = client.receive_message(url, visibility_timeout=30)[0]
    assert client.receive_message(url, wait_time_seconds=0) == []
    client.change_message_visibility(url, m.receipt_handle, 60)
    assert depth(client, url) == (0, 1, 0)
    client.change_message_visibility(url, m.receipt_handle, 0)
    assert depth(client, url) == (1, 0, 0)
    again = client.receive_message(url, attribute_names=["ApproximateReceiveCount"])
    assert [x.message_id for x in again] == [sent.message_id]
    assert again[0].attributes["ApproximateReceiveCount"] == "2"


def test_change_message_visibility_batch(client: Client, make_queue, depth) -> None:
    url = make_queue("chvisbatch")
    client.send_message_batch(url, [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(3)])
    got = client.receive_message(url, max_number_of_messages=10, visibility_timeout=30)
    assert len(got) == 3
    result = client.change_message_visibility_batch(url, [
        {"Id": "zero", "ReceiptHandle": got[0].receipt_handle, "VisibilityTimeout": 0},
        {"Id": "longer", "ReceiptHandle": got[1].receipt_handle, "VisibilityTimeout": 300},
        {"Id": "bad", "ReceiptHandle": "garbled!", "VisibilityTimeout": 0},
        {"Id": "range", "ReceiptHandle": got[2].receipt_handle, "VisibilityTimeout": 43201},
    ])
    assert sorted(s.id for s in result.successful) == ["longer", "zero"]
    assert {f.id: f.code for f in result.failed} == {
        "bad": "ReceiptHandleIsInvalid", "range": "InvalidParameterValue",
    }
    assert depth(client, url) == (1, 2, 0)
    back = client.receive_message(url, max_number_of_messages=10, wait_time_seconds=0)
    assert [m.message_id for m in back] == [got[0].message_id]


def test_message_at_maximum_size_is_accepted(client: Client, make_queue) -> None:
    url = make_queue("maxsize", {"MaximumMessageSize": "1024"})
    body = "é" * 512  # 1024 UTF-8 bytes
    sent = client.send_message(url, body)
    assert sent.md5_of_message_body == md5(body)
    assert client.receive_message(url)[0].body == body


def test_large_default_size_message(client: Client, make_queue) -> None:
    url = make_queue("big")
    body = "x" * 1048576
    sent = client.send_message(url, body)
    m = client.receive_message(url)[0]
    assert m.message_id == sent.message_id
    assert m.md5_of_body == md5(body) == sent.md5_of_message_body
    assert len(m.body) == len(body)


def test_client_context_manager_and_close(server) -> None:
    with Client(server.endpoint) as c:
        url = c.create_queue(unique_name("ctx"))
        assert c.get_queue_url(name_of(url)) == url
    c2 = Client(f"http://{server.endpoint}/")
    try:
        assert c2.get_queue_url(name_of(url)) == url
    finally:
        c2.close()


def test_latest_handle_deletes_after_the_message_came_back(client: Client, make_queue) -> None:
    url = make_queue("latest")
    client.send_message(url, "back again")
    m = client.receive_message(url, visibility_timeout=0)[0]  # visible again at once
    # Nobody received it since: the latest handle still deletes it.
    client.delete_message(url, m.receipt_handle)
    assert client.receive_message(url, wait_time_seconds=0) == []
    assert client.get_queue_attributes(url, ["ApproximateNumberOfMessages"]) == {
        "ApproximateNumberOfMessages": "0"}


def test_send_with_aws_trace_header(client: Client, make_queue) -> None:
    url = make_queue("trace")
    trace = {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-abc;Sampled=0"}}
    sent = client.send_message(url, "traced", message_system_attributes=trace)
    assert sent.md5_of_message_system_attributes is not None
    (m,) = client.receive_message(url, message_system_attribute_names=["AWSTraceHeader"])
    assert m.attributes == {"AWSTraceHeader": "Root=1-abc;Sampled=0"}
    with pytest.raises(QueueError) as e:
        client.send_message(url, "x", message_system_attributes={
            "Nope": {"DataType": "String", "StringValue": "v"}})
    assert e.value.code == "InvalidParameterValue"
