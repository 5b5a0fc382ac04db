"""Every bad input of the single-node issue: its SQS error code, and the queue left as it was.

Each test works on ``loaded``: a fresh queue holding two messages. After the bad call the
queue must report the same depth and both messages must still be receivable, unchanged.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from sqsq.client import Client
from sqsq.errors import QueueError


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def name_of(url: str) -> str:
    return url.rsplit("/", 1)[-1]


class Loaded:
    """A queue with two messages and the means to check they are untouched."""

    def __init__(self, client: Client, url: str, sent: dict[str, str], check) -> None:
        self.client = client
        self.url = url
        self.sent = sent
        self._check = check
        self.attributes = client.get_queue_attributes(url)

    def untouched(self) -> None:
        after = self.client.get_queue_attributes(self.url)
        for key in ("VisibilityTimeout", "DelaySeconds", "MaximumMessageSize",
                    "MessageRetentionPeriod", "ReceiveMessageWaitTimeSeconds",
                    "LastModifiedTimestamp"):
            assert after[key] == self.attributes[key], key
        assert "RedrivePolicy" not in after
        self._check(self.client, self.url, self.sent)


@pytest.fixture
def loaded(client: Client, make_queue, assert_untouched) -> Loaded:
    url = make_queue("bad", {"MaximumMessageSize": "2048"})
    sent = {}
    for body in ("first", "second"):
        sent[client.send_message(url, body).message_id] = body
    return Loaded(client, url, sent, assert_untouched)


def expect(code: str, call: Callable[[], Any]) -> QueueError:
    with pytest.raises(QueueError) as e:
        call()
    assert e.value.code == code, f"{e.value!r}"
    assert e.value.message
    return e.value


# ---- queues --------------------------------------------------------------------------------


@pytest.mark.parametrize("action", [
    "get_queue_url", "send_message", "send_message_batch", "receive_message", "delete_message",
    "delete_message_batch", "change_message_visibility", "change_message_visibility_batch",
    "get_queue_attributes", "set_queue_attributes", "purge_queue", "delete_queue",
    "tag_queue", "untag_queue", "list_queue_tags", "list_dead_letter_source_queues",
])
def test_queue_does_not_exist(loaded: Loaded, action: str) -> None:
    c = loaded.client
    missing = unique_name("missing")
    # A real handle from another queue: the queue check comes first.
    handle = c.receive_message(loaded.url, visibility_timeout=0)[0].receipt_handle
    calls: dict[str, Callable[[], Any]] = {
        "get_queue_url": lambda: c.get_queue_url(missing),
        "send_message": lambda: c.send_message(missing, "x"),
        "send_message_batch": lambda: c.send_message_batch(
            missing, [{"Id": "a", "MessageBody": "x"}]),
        "receive_message": lambda: c.receive_message(missing, wait_time_seconds=0),
        "delete_message": lambda: c.delete_message(missing, handle),
        "delete_message_batch": lambda: c.delete_message_batch(
            missing, [{"Id": "a", "ReceiptHandle": handle}]),
        "change_message_visibility": lambda: c.change_message_visibility(missing, handle, 5),
        "change_message_visibility_batch": lambda: c.change_message_visibility_batch(
            missing, [{"Id": "a", "ReceiptHandle": handle, "VisibilityTimeout": 5}]),
        "get_queue_attributes": lambda: c.get_queue_attributes(missing),
        "set_queue_attributes": lambda: c.set_queue_attributes(
            missing, {"VisibilityTimeout": "5"}),
        "purge_queue": lambda: c.purge_queue(missing),
        "delete_queue": lambda: c.delete_queue(missing),
        "tag_queue": lambda: c.tag_queue(missing, {"a": "b"}),
        "untag_queue": lambda: c.untag_queue(missing, ["a"]),
        "list_queue_tags": lambda: c.list_queue_tags(missing),
        "list_dead_letter_source_queues": lambda: c.list_dead_letter_source_queues(missing),
    }
    expect("QueueDoesNotExist", calls[action])
    loaded.untouched()


def test_queue_already_exists(loaded: Loaded) -> None:
    expect("QueueAlreadyExists", lambda: loaded.client.create_queue(
        name_of(loaded.url), {"VisibilityTimeout": "99"}))
    loaded.untouched()


def test_queue_deleted_recently(client: Client) -> None:
    name = unique_name("recent")
    url = client.create_queue(name)
    client.send_message(url, "gone with the queue")
    client.delete_queue(url)
    expect("QueueDeletedRecently", lambda: client.create_queue(name))
    expect("QueueDoesNotExist", lambda: client.get_queue_url(name))


def test_purge_queue_in_progress(client: Client, make_queue, assert_untouched) -> None:
    url = make_queue("purge2")
    client.send_message(url, "purged")
    client.purge_queue(url)
    sent = {client.send_message(url, b).message_id: b for b in ("kept1", "kept2")}
    expect("PurgeQueueInProgress", lambda: client.purge_queue(url))
    assert_untouched(client, url, sent)


@pytest.mark.parametrize("name,attributes", [
    ("", None),
    ("has space", None),
    ("bad!char", None),
    ("dots.in.name", None),
    ("x" * 81, None),
    ("ünïcode", None),
    ("x" * 76 + ".fifo", {"FifoQueue": "true"}),  # 81 with the suffix
    ("plain.fifo", None),  # .fifo suffix on a standard queue
    ("plain-name", {"FifoQueue": "true"}),  # FIFO without the suffix
    ("named.fifo", {"FifoQueue": "false"}),
])
def test_bad_queue_names(client: Client, name: str, attributes: dict | None) -> None:
    if name.startswith("x"):  # the over-long names: unique, same length
        name = uuid.uuid4().hex[:12] + name[12:]
    expect("InvalidParameterValue", lambda: client.create_queue(name, attributes))
    if name:
        assert client.list_queues(name) == []


def test_longest_queue_names_are_fine(client: Client) -> None:
    long_name = uuid.uuid4().hex + "y" * 48  # 80
    assert name_of(client.create_queue(long_name)) == long_name
    fifo = uuid.uuid4().hex + "z" * 43 + ".fifo"  # 80 with the suffix
    assert name_of(client.create_queue(fifo, {"FifoQueue": "true"})) == fifo


@pytest.mark.parametrize("attribute,value", [
    ("VisibilityTimeout", "43201"),
    ("VisibilityTimeout", "-1"),
    ("VisibilityTimeout", "soon"),
    ("DelaySeconds", "901"),
    ("MessageRetentionPeriod", "59"),
    ("MessageRetentionPeriod", "1209601"),
    ("MaximumMessageSize", "1023"),
    ("MaximumMessageSize", "1048577"),
    ("ReceiveMessageWaitTimeSeconds", "21"),
])
def test_bad_queue_attribute_values(loaded: Loaded, attribute: str, value: str) -> None:
    # SQS answers out-of-range or malformed attribute values with InvalidAttributeValue.
    expect("InvalidAttributeValue",
           lambda: loaded.client.set_queue_attributes(loaded.url, {attribute: value}))
    # Nothing of a rejected request applies, not even its valid parts.
    expect("InvalidAttributeValue", lambda: loaded.client.set_queue_attributes(
        loaded.url, {"DelaySeconds": "5", attribute: value}))
    loaded.untouched()


def test_bad_queue_attribute_values_on_create(client: Client) -> None:
    name = unique_name("badcreate")
    expect("InvalidAttributeValue",
           lambda: client.create_queue(name, {"VisibilityTimeout": "43201"}))
    expect("QueueDoesNotExist", lambda: client.get_queue_url(name))


@pytest.mark.parametrize("policy", [
    "not json",
    json.dumps({"maxReceiveCount": 3}),
    json.dumps({"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:nope-" +
                uuid.uuid4().hex, "maxReceiveCount": 3}),
])  # (the queue itself is a valid target, as in SQS: tests/http/test_fidelity.py)
def test_bad_redrive_policy(loaded: Loaded, policy: str) -> None:
    expect("InvalidParameterValue",
           lambda: loaded.client.set_queue_attributes(loaded.url, {"RedrivePolicy": policy}))
    loaded.untouched()


def test_invalid_attribute_name(loaded: Loaded) -> None:
    c = loaded.client
    expect("InvalidAttributeName", lambda: c.get_queue_attributes(loaded.url, ["Bogus"]))
    expect("InvalidAttributeName", lambda: c.set_queue_attributes(loaded.url, {"Bogus": "1"}))
    expect("InvalidAttributeName", lambda: c.create_queue(unique_name("n"), {"Bogus": "1"}))
    expect("InvalidAttributeName", lambda: c.receive_message(
        loaded.url, attribute_names=["Bogus"], wait_time_seconds=0))
    # ContentBasedDeduplication is a FIFO-only attribute.
    expect("InvalidAttributeName", lambda: c.set_queue_attributes(
        loaded.url, {"ContentBasedDeduplication": "true"}))
    loaded.untouched()


def test_list_queues_bad_max_results(client: Client) -> None:
    expect("InvalidParameterValue", lambda: client.list_queues(max_results=1001))


def test_bad_tags(loaded: Loaded) -> None:
    expect("InvalidParameterValue",
           lambda: loaded.client.tag_queue(loaded.url, {"k" * 129: "v"}))
    expect("InvalidParameterValue",
           lambda: loaded.client.tag_queue(loaded.url, {"k": "v" * 257}))
    assert loaded.client.list_queue_tags(loaded.url) == {}
    loaded.untouched()


# ---- receive parameters --------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 11, -1])
def test_bad_max_number_of_messages(loaded: Loaded, n: int) -> None:
    expect("InvalidParameterValue", lambda: loaded.client.receive_message(
        loaded.url, max_number_of_messages=n, wait_time_seconds=0))
    loaded.untouched()


@pytest.mark.parametrize("timeout", [-1, 43201])
def test_bad_receive_visibility_timeout(loaded: Loaded, timeout: int) -> None:
    expect("InvalidParameterValue", lambda: loaded.client.receive_message(
        loaded.url, visibility_timeout=timeout, wait_time_seconds=0))
    loaded.untouched()


@pytest.mark.parametrize("wait", [-1, 21])
def test_bad_wait_time(loaded: Loaded, wait: int) -> None:
    expect("InvalidParameterValue", lambda: loaded.client.receive_message(
        loaded.url, wait_time_seconds=wait))
    loaded.untouched()


# ---- send ----------------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [-1, 901])
def test_bad_delay(loaded: Loaded, delay: int) -> None:
    expect("InvalidParameterValue",
           lambda: loaded.client.send_message(loaded.url, "x", delay_seconds=delay))
    loaded.untouched()


@pytest.mark.parametrize("body", ["\x00", "nul in \x00 the middle", "\x08", "\ufffe", "\x1f"])
def test_invalid_message_contents(loaded: Loaded, body: str) -> None:
    expect("InvalidMessageContents", lambda: loaded.client.send_message(loaded.url, body))
    loaded.untouched()


def test_empty_body_is_missing(loaded: Loaded) -> None:
    expect("MissingParameter", lambda: loaded.client.send_message(loaded.url, ""))
    loaded.untouched()


def test_message_too_large(loaded: Loaded) -> None:
    c = loaded.client
    # The queue's MaximumMessageSize is 2048 bytes.
    expect("InvalidParameterValue", lambda: c.send_message(loaded.url, "x" * 2049))
    expect("InvalidParameterValue", lambda: c.send_message(loaded.url, "é" * 1025))
    # Message attributes count toward the size.
    expect("InvalidParameterValue", lambda: c.send_message(
        loaded.url, "x" * 2000,
        message_attributes={"pad": {"DataType": "String", "StringValue": "y" * 100}}))
    loaded.untouched()


def test_message_over_the_default_maximum(client: Client, make_queue, assert_untouched) -> None:
    url = make_queue("huge")
    sent = {client.send_message(url, "small").message_id: "small"}
    expect("InvalidParameterValue", lambda: client.send_message(url, "x" * 1048577))
    assert_untouched(client, url, sent)


@pytest.mark.parametrize("attrs", [
    {"n": {"DataType": "Number", "StringValue": "not a number"}},
    {"AWS.reserved": {"DataType": "String", "StringValue": "x"}},
    {"bad name!": {"DataType": "String", "StringValue": "x"}},
    {"t": {"DataType": "Unknown", "StringValue": "x"}},
    {"t": {"DataType": "", "StringValue": "x"}},
    {"b": {"DataType": "Binary"}},
    {f"a{i}": {"DataType": "String", "StringValue": "x"} for i in range(11)},
])
def test_bad_message_attributes(loaded: Loaded, attrs: dict) -> None:
    expect("InvalidParameterValue",
           lambda: loaded.client.send_message(loaded.url, "x", message_attributes=attrs))
    loaded.untouched()


def test_deduplication_id_on_a_standard_queue(loaded: Loaded) -> None:
    expect("InvalidParameterValue", lambda: loaded.client.send_message(
        loaded.url, "x", message_deduplication_id="d"))
    loaded.untouched()


def test_fifo_missing_group_id(client: Client, make_queue, assert_untouched) -> None:
    url = make_queue("fifobad", fifo=True)
    sent = {client.send_message(url, "ok", message_group_id="g",
                                message_deduplication_id="d1").message_id: "ok"}
    expect("MissingParameter",
           lambda: client.send_message(url, "no group", message_deduplication_id="d2"))
    # No deduplication id and no content-based deduplication.
    expect("InvalidParameterValue", lambda: client.send_message(url, "no dedup",
                                                                message_group_id="g"))
    expect("InvalidParameterValue", lambda: client.send_message(
        url, "bad group", message_group_id="sp ace", message_deduplication_id="d3"))
    result = client.send_message_batch(url, [{"Id": "a", "MessageBody": "no group",
                                              "MessageDeduplicationId": "d4"}])
    assert [(f.id, f.code) for f in result.failed] == [("a", "MissingParameter")]
    assert_untouched(client, url, sent)


# ---- receipt handles -----------------------------------------------------------------------


def _forge(handle: str) -> str:
    """The same handle with one byte of its body changed: the MAC no longer matches."""
    raw = bytearray(base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)))
    raw[12] ^= 0x01
    return base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


def _in_flight(loaded: Loaded) -> list:
    got = loaded.client.receive_message(loaded.url, max_number_of_messages=10,
                                        visibility_timeout=30)
    assert len(got) == 2
    return got


def _release(loaded: Loaded, messages: list) -> None:
    """Make the in-flight messages visible again with their latest handles."""
    for m in messages:
        loaded.client.change_message_visibility(loaded.url, m.receipt_handle, 0)


@pytest.mark.parametrize("kind", ["garbled", "forged", "truncated", "other-queue", "empty"])
def test_receipt_handle_is_invalid(loaded: Loaded, make_queue, kind: str) -> None:
    c = loaded.client
    held = _in_flight(loaded)
    real = held[0].receipt_handle
    if kind == "garbled":
        bad = "this is not a receipt handle"
    elif kind == "forged":
        bad = _forge(real)
    elif kind == "truncated":
        bad = real[:-4]
    elif kind == "empty":
        bad = ""
    else:
        other = make_queue("other")
        c.send_message(other, "elsewhere")
        bad = c.receive_message(other)[0].receipt_handle
    assert bad != real
    expect("ReceiptHandleIsInvalid", lambda: c.delete_message(loaded.url, bad))
    expect("ReceiptHandleIsInvalid", lambda: c.change_message_visibility(loaded.url, bad, 0))
    result = c.delete_message_batch(loaded.url, [{"Id": "x", "ReceiptHandle": bad}])
    assert [(f.id, f.code) for f in result.failed] == [("x", "ReceiptHandleIsInvalid")]
    result = c.change_message_visibility_batch(
        loaded.url, [{"Id": "x", "ReceiptHandle": bad, "VisibilityTimeout": 0}])
    assert [(f.id, f.code) for f in result.failed] == [("x", "ReceiptHandleIsInvalid")]
    # A batch entry without its VisibilityTimeout is refused by the SDK, not sent as 0.
    expect("MissingParameter", lambda: c.change_message_visibility_batch(
        loaded.url, [{"Id": "x", "ReceiptHandle": real}]))
    # Both messages are still in flight, held by their real handles.
    assert c.get_queue_attributes(loaded.url, ["ApproximateNumberOfMessagesNotVisible"]) == {
        "ApproximateNumberOfMessagesNotVisible": "2"}
    _release(loaded, held)
    loaded.untouched()


def test_stale_receipt_handle(loaded: Loaded) -> None:
    c = loaded.client
    first = c.receive_message(loaded.url, max_number_of_messages=10, visibility_timeout=0)
    assert len(first) == 2
    second = c.receive_message(loaded.url, max_number_of_messages=10, visibility_timeout=30)
    assert {m.message_id for m in second} == set(loaded.sent)
    stale = next(m for m in first if m.message_id == second[0].message_id).receipt_handle
    expect("InvalidParameterValue", lambda: c.delete_message(loaded.url, stale))
    expect("InvalidParameterValue", lambda: c.change_message_visibility(loaded.url, stale, 0))
    result = c.delete_message_batch(loaded.url, [{"Id": "s", "ReceiptHandle": stale}])
    assert [(f.id, f.code) for f in result.failed] == [("s", "InvalidParameterValue")]
    # Still in flight under the latest handles: nothing came back, nothing was deleted.
    assert c.receive_message(loaded.url, max_number_of_messages=10, wait_time_seconds=0) == []
    _release(loaded, second)
    loaded.untouched()


def test_message_not_inflight(client: Client, make_queue) -> None:
    """On a FIFO queue a released message's handle no longer changes its visibility. (On a
    standard queue the latest handle still does, as in SQS: tests/http/test_fidelity.py.)"""
    url = make_queue("notinflight", {"ContentBasedDeduplication": "true"}, fifo=True)
    for body in ("first", "second"):
        client.send_message(url, body, message_group_id=body)
    held = client.receive_message(url, max_number_of_messages=10, wait_time_seconds=0)
    assert len(held) == 2
    for m in held:
        client.change_message_visibility(url, m.receipt_handle, 0)
    expect("MessageNotInflight",
           lambda: client.change_message_visibility(url, held[0].receipt_handle, 30))
    result = client.change_message_visibility_batch(url, [
        {"Id": "a", "ReceiptHandle": held[1].receipt_handle, "VisibilityTimeout": 30}])
    assert [(f.id, f.code) for f in result.failed] == [("a", "MessageNotInflight")]
    again = client.receive_message(url, max_number_of_messages=10, wait_time_seconds=0)
    assert sorted(m.body for m in again) == ["first", "second"]


def test_bad_change_visibility_timeout(loaded: Loaded) -> None:
    c = loaded.client
    held = _in_flight(loaded)
    expect("InvalidParameterValue",
           lambda: c.change_message_visibility(loaded.url, held[0].receipt_handle, 43201))
    expect("InvalidParameterValue",
           lambda: c.change_message_visibility(loaded.url, held[0].receipt_handle, -1))
    _release(loaded, held)
    loaded.untouched()


# ---- batches -------------------------------------------------------------------------------


def _batch_calls(c: Client, url: str, ids: list[str], handle: str) -> dict[str, Callable]:
    return {
        "send": lambda: c.send_message_batch(
            url, [{"Id": i, "MessageBody": f"body {i}"} for i in ids]),
        "delete": lambda: c.delete_message_batch(
            url, [{"Id": i, "ReceiptHandle": handle} for i in ids]),
        "visibility": lambda: c.change_message_visibility_batch(
            url, [{"Id": i, "ReceiptHandle": handle, "VisibilityTimeout": 0} for i in ids]),
    }


BATCH_CASES = [
    ("TooManyEntriesInBatchRequest", [f"e{i}" for i in range(11)]),
    ("BatchEntryIdsNotDistinct", ["a", "b", "a"]),
    ("EmptyBatchRequest", []),
    ("InvalidBatchEntryId", ["ok", "not ok!"]),
    ("InvalidBatchEntryId", ["x" * 81]),
]


@pytest.mark.parametrize("action", ["send", "delete", "visibility"])
@pytest.mark.parametrize("code,ids", BATCH_CASES)
def test_bad_batches(loaded: Loaded, action: str, code: str, ids: list[str]) -> None:
    held = _in_flight(loaded)
    call = _batch_calls(loaded.client, loaded.url, ids, held[0].receipt_handle)[action]
    expect(code, call)
    # The whole request was refused: the held message is still held by the same handle.
    _release(loaded, held)
    loaded.untouched()


def test_batch_request_too_long(loaded: Loaded, client: Client, make_queue,
                                assert_untouched) -> None:
    url = make_queue("toolong")
    sent = {client.send_message(url, "small").message_id: "small"}
    entries = [{"Id": f"e{i}", "MessageBody": "x" * 400_000} for i in range(3)]
    expect("BatchRequestTooLong", lambda: client.send_message_batch(url, entries))
    assert_untouched(client, url, sent)


def test_over_size_request_is_an_sqs_error(client: Client, make_queue) -> None:
    """5 MiB through the SDK: past gRPC's message limit, reported as SQS reports a too-long
    message (InvalidParameterValue), not a bare RESOURCE_EXHAUSTED."""
    url = make_queue("huge")
    e = expect("InvalidParameterValue", lambda: client.send_message(url, "x" * (5 * 1024 * 1024)))
    assert "shorter than 1048576 bytes" in e.message
    assert client.receive_message(url, wait_time_seconds=0) == []
