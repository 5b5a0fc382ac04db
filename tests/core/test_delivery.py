"""Standard-queue delivery through the pure core, driven with a fake clock."""

from __future__ import annotations

import json

import pytest

from coresupport import Core
from sqsq.core import commands as c
from sqsq.core import limits
from sqsq.core.messages import MessageAttributeValue, md5_of_message_attributes
from sqsq.errors import ErrorCode, Rejection

Q = "jobs"


# ---- helpers ------------------------------------------------------------------------------


def sent_id(res: c.Result) -> str:
    assert isinstance(res, c.BatchResult), res
    assert not res.failed, res.failed
    (one,) = res.successful
    return one.message_id


def entry_ok(res: c.Result) -> None:
    assert isinstance(res, c.BatchResult), res
    assert res.failed == () and res.successful == ("0",), res


def entry_error(res: c.Result) -> Rejection:
    assert isinstance(res, c.BatchResult), res
    assert res.successful == (), res
    (f,) = res.failed
    return f.rejection


def attr(m: c.ReceivedMessage, name: str) -> str:
    return dict(m.attributes)[name]


def ids(msgs: list) -> list[str]:
    return [m.message_id for m in msgs]


def arn(name: str) -> str:
    return f"arn:aws:sqs:us-east-1:000000000000:{name}"


def redrive(target: str, count: int) -> str:
    return f'{{"deadLetterTargetArn":"{arn(target)}","maxReceiveCount":{count}}}'


@pytest.fixture
def core() -> Core:
    k = Core()
    assert k.create(Q, VisibilityTimeout=30) == c.QueueCreated(Q)
    return k


# ---- send, receive, delete ------------------------------------------------------------------


def test_send_receive_delete(core: Core) -> None:
    mid = sent_id(core.send(Q, "hello", message_attributes={"k": "v"}))
    assert core.depth(Q) == (1, 0, 0)
    (m,) = core.receive(Q)
    assert m.message_id == mid and m.body == "hello"
    assert dict(m.message_attributes) == {"k": MessageAttributeValue("String", "v")}
    assert attr(m, "ApproximateReceiveCount") == "1"
    assert attr(m, "SentTimestamp") == str(core.now_ms)
    assert core.depth(Q) == (0, 1, 0)
    assert core.receive(Q) == []  # hidden while in flight
    entry_ok(core.delete(Q, m.receipt_handle))
    assert core.depth(Q) == (0, 0, 0)
    core.advance(3600)
    assert core.receive(Q) == []


def test_receive_respects_max_and_each_message_once(core: Core) -> None:
    sent = [sent_id(core.send(Q, f"m{i}")) for i in range(7)]
    first = core.receive(Q, 5)
    second = core.receive(Q, 5)
    assert len(first) == 5 and len(second) == 2
    assert sorted(ids(first) + ids(second)) == sorted(sent)
    assert core.receive(Q, 10) == []
    assert core.depth(Q) == (0, 7, 0)


def test_receive_of_big_messages_stops_before_a_reply_too_large_to_carry(core: Core) -> None:
    # Ten 1 MiB messages make a 10 MiB reply, past the 4 MiB a gRPC message carries: the
    # receive takes what fits and leaves the rest visible for the next one.
    body = "x" * (limits.MAXIMUM_MESSAGE_SIZE_BYTES[1] - 100)
    sent = [sent_id(core.send(Q, f"{i:02d}{body}")) for i in range(10)]
    got: list[c.ReceivedMessage] = []
    while batch := core.receive(Q, 10):
        assert len(batch) < 10
        assert sum(len(m.body) for m in batch) <= limits.RECEIVE_REPLY_MAX_BYTES
        got += batch
    assert sorted(ids(got)) == sorted(sent)
    assert core.depth(Q) == (0, 10, 0)


def test_visibility_timeout_expiry_brings_message_back(core: Core) -> None:
    mid = sent_id(core.send(Q, "x"))
    (m1,) = core.receive(Q, timeout=10)
    core.advance(9.999)
    assert core.receive(Q) == []
    assert core.depth(Q) == (0, 1, 0)
    core.advance(0.001)
    assert core.depth(Q) == (1, 0, 0)
    (m2,) = core.receive(Q, timeout=10)
    assert m2.message_id == mid
    assert attr(m2, "ApproximateReceiveCount") == "2"
    first = "ApproximateFirstReceiveTimestamp"
    assert attr(m2, first) == attr(m1, first)
    assert m2.receipt_handle != m1.receipt_handle


def test_queue_default_visibility_timeout_applies(core: Core) -> None:
    sent_id(core.send(Q, "x"))
    core.receive(Q)  # queue default: 30 s
    core.advance(29)
    assert core.receive(Q) == []
    core.advance(1)
    assert len(core.receive(Q)) == 1


def test_stale_handle_fails_and_changes_nothing(core: Core) -> None:
    sent_id(core.send(Q, "x"))
    (old,) = core.receive(Q, timeout=5)
    core.advance(5)
    (new,) = core.receive(Q, timeout=30)
    before = core.depth(Q)

    rej = entry_error(core.delete(Q, old.receipt_handle))
    assert rej.code is ErrorCode.INVALID_PARAMETER_VALUE and "expired" in rej.message
    rej = entry_error(core.change(Q, old.receipt_handle, 0))
    assert rej.code is ErrorCode.INVALID_PARAMETER_VALUE and "expired" in rej.message

    assert core.depth(Q) == before == (0, 1, 0)
    assert core.receive(Q) == []  # the stale change to 0 did not release it
    core.advance(29)
    assert core.receive(Q) == []  # nor did anything shorten the live holder's timeout
    # The latest holder is unaffected.
    entry_ok(core.change(Q, new.receipt_handle, 60))
    entry_ok(core.delete(Q, new.receipt_handle))
    assert core.depth(Q) == (0, 0, 0)


def test_latest_handle_deletes_after_its_timeout_if_nobody_received(core: Core) -> None:
    sent_id(core.send(Q, "x"))
    (m,) = core.receive(Q, timeout=5)
    core.advance(100)
    assert core.depth(Q) == (1, 0, 0)
    entry_ok(core.delete(Q, m.receipt_handle))
    assert core.depth(Q) == (0, 0, 0)
    assert core.receive(Q) == []


def test_latest_handle_deletes_after_timeout_and_sweep(core: Core) -> None:
    sent_id(core.send(Q, "x"))
    (m,) = core.receive(Q, timeout=5)
    core.advance(6)
    assert isinstance(core.run(c.Sweep()), c.Swept)
    entry_ok(core.delete(Q, m.receipt_handle))
    assert core.depth(Q) == (0, 0, 0)
    assert core.receive(Q) == []


def test_deleting_twice_succeeds(core: Core) -> None:
    sent_id(core.send(Q, "x"))
    sent_id(core.send(Q, "y"))
    (m,) = core.receive(Q)
    entry_ok(core.delete(Q, m.receipt_handle))
    entry_ok(core.delete(Q, m.receipt_handle))
    assert core.depth(Q) == (1, 0, 0)  # the other message is untouched


def _handles(core: Core) -> str:
    sent_id(core.send(Q, "x"))
    (m,) = core.receive(Q)
    return m.receipt_handle


@pytest.mark.parametrize("mangle", [
    lambda h: "",
    lambda h: "not-a-handle",
    lambda h: "%%%%",
    lambda h: h[:-2],
    lambda h: h + "AA",
    lambda h: h[:10] + ("A" if h[10] != "A" else "B") + h[11:],  # one altered character
    lambda h: "x" * 400,
])
def test_forged_or_garbled_handle_is_invalid(core: Core, mangle) -> None:
    handle = _handles(core)
    bad = mangle(handle)
    assert bad != handle
    for res in (core.delete(Q, bad), core.change(Q, bad, 0)):
        assert entry_error(res).code is ErrorCode.RECEIPT_HANDLE_IS_INVALID
    assert core.depth(Q) == (0, 1, 0)
    entry_ok(core.delete(Q, handle))


def test_handle_from_another_queue_is_invalid(core: Core) -> None:
    core.create("other")
    handle = _handles(core)
    sent_id(core.send("other", "y"))
    for res in (core.delete("other", handle), core.change("other", handle, 0)):
        assert entry_error(res).code is ErrorCode.RECEIPT_HANDLE_IS_INVALID
    assert core.depth(Q) == (0, 1, 0)
    assert core.depth("other") == (1, 0, 0)


def test_handle_signed_with_another_secret_is_invalid(core: Core) -> None:
    from sqsq.core.receipts import (
        ReceiptHandle,
        decode_receipt_handle,
        encode_receipt_handle,
        queue_name_hash,
    )

    handle = _handles(core)
    real = decode_receipt_handle(b"test-secret", handle)
    assert real is not None
    forged = encode_receipt_handle(b"guessed", ReceiptHandle(
        real.shard_id, real.queue_id, real.seq, real.epoch, queue_name_hash(Q), real.nonce))
    assert entry_error(core.delete(Q, forged)).code is ErrorCode.RECEIPT_HANDLE_IS_INVALID
    assert core.depth(Q) == (0, 1, 0)


# ---- ChangeMessageVisibility ----------------------------------------------------------------


def test_change_visibility_extends(core: Core) -> None:
    sent_id(core.send(Q, "x"))
    (m,) = core.receive(Q, timeout=10)
    core.advance(8)
    entry_ok(core.change(Q, m.receipt_handle, 20))  # counts from now: due at 28
    core.advance(19)
    assert core.receive(Q) == []
    core.advance(1)
    (again,) = core.receive(Q)
    assert attr(again, "ApproximateReceiveCount") == "2"


def test_change_visibility_shortens(core: Core) -> None:
    sent_id(core.send(Q, "x"))
    (m,) = core.receive(Q, timeout=600)
    entry_ok(core.change(Q, m.receipt_handle, 5))
    core.advance(4)
    assert core.receive(Q) == []
    core.advance(1)
    assert len(core.receive(Q)) == 1


def test_change_visibility_zero_makes_visible_at_once(core: Core) -> None:
    mid = sent_id(core.send(Q, "x"))
    (m,) = core.receive(Q, timeout=600)
    entry_ok(core.change(Q, m.receipt_handle, 0))
    assert core.depth(Q) == (1, 0, 0)
    (again,) = core.receive(Q)
    assert again.message_id == mid
    # The old handle is now stale.
    assert entry_error(core.delete(Q, m.receipt_handle)).code is ErrorCode.INVALID_PARAMETER_VALUE
    entry_ok(core.delete(Q, again.receipt_handle))


def test_change_visibility_after_expiry_applies_with_the_latest_handle(core: Core) -> None:
    """As Amazon answers on a standard queue: the latest handle of a message whose timeout ran
    out (nobody received it since) still changes its visibility: it is hidden again."""
    sent_id(core.send(Q, "x"))
    (m,) = core.receive(Q, timeout=10)
    core.advance(10)
    entry_ok(core.change(Q, m.receipt_handle, 30))  # before the sweep saw the timeout
    assert core.depth(Q) == (0, 1, 0)
    core.advance(30)
    core.run(c.Sweep())  # and after the timer has been materialised
    assert core.depth(Q) == (1, 0, 0)
    entry_ok(core.change(Q, m.receipt_handle, 20))
    assert core.depth(Q) == (0, 1, 0) and core.receive(Q) == []
    entry_ok(core.change(Q, m.receipt_handle, 0))
    (again,) = core.receive(Q)
    assert again.message_id == m.message_id
    # Superseded by that receive, the first handle is refused (sqsq's fencing).
    assert entry_error(core.change(Q, m.receipt_handle, 30)).code is \
        ErrorCode.INVALID_PARAMETER_VALUE


def test_change_visibility_out_of_range(core: Core) -> None:
    sent_id(core.send(Q, "x"))
    (m,) = core.receive(Q, timeout=10)
    for bad in (-1, 43_201):
        assert entry_error(core.change(Q, m.receipt_handle, bad)).code is \
            ErrorCode.INVALID_PARAMETER_VALUE
    core.advance(10)
    assert len(core.receive(Q)) == 1  # the deadline was not moved


def test_change_visibility_capped_at_12_hours_from_the_receive(core: Core) -> None:
    sent_id(core.send(Q, "x"))
    (m,) = core.receive(Q, timeout=60)
    core.advance(30)
    entry_ok(core.change(Q, m.receipt_handle, 43_200 - 30))  # exactly 12 h after the receive
    core.advance(3600)
    rej = entry_error(core.change(Q, m.receipt_handle, 43_200 - 3600))
    assert rej.code is ErrorCode.INVALID_PARAMETER_VALUE
    assert "Total VisibilityTimeout for the message is beyond the limit [43200 seconds]" in \
        rej.message
    entry_ok(core.change(Q, m.receipt_handle, 43_200 - 3630))  # what is left still works
    core.advance(43_200 - 3630 - 1)
    assert core.receive(Q) == []  # the refused change moved nothing
    core.advance(1)
    (again,) = core.receive(Q, timeout=60)
    # A new receive starts a new 12 hours.
    entry_ok(core.change(Q, again.receipt_handle, 43_200))


def test_change_visibility_of_deleted_message_fails(core: Core) -> None:
    sent_id(core.send(Q, "x"))
    (m,) = core.receive(Q)
    entry_ok(core.delete(Q, m.receipt_handle))
    assert entry_error(core.change(Q, m.receipt_handle, 10)).code is \
        ErrorCode.INVALID_PARAMETER_VALUE


# ---- delays ---------------------------------------------------------------------------------


def test_queue_delay_seconds(core: Core) -> None:
    core.create("slow", DelaySeconds=20)
    mid = sent_id(core.send("slow", "x"))
    assert core.depth("slow") == (0, 0, 1)
    core.advance(19.999)
    assert core.receive("slow") == []
    assert core.depth("slow") == (0, 0, 1)
    core.advance(0.001)
    assert core.depth("slow") == (1, 0, 0)
    assert ids(core.receive("slow")) == [mid]


def test_per_message_delay_overrides_queue_delay(core: Core) -> None:
    core.create("slow", DelaySeconds=20)
    now = sent_id(core.send("slow", "now", delay_seconds=0))
    later = sent_id(core.send("slow", "later", delay_seconds=60))
    assert core.depth("slow") == (1, 0, 1)
    assert ids(core.receive("slow", 10, timeout=600)) == [now]
    core.advance(59)
    assert core.receive("slow", 10) == []
    core.advance(1)
    assert ids(core.receive("slow", 10)) == [later]


def test_per_message_delay_on_standard_queue(core: Core) -> None:
    a = sent_id(core.send(Q, "a", delay_seconds=5))
    b = sent_id(core.send(Q, "b"))
    assert core.depth(Q) == (1, 0, 1)
    assert ids(core.receive(Q, 10)) == [b]
    core.advance(5)
    assert ids(core.receive(Q, 10)) == [a]


def test_delay_seconds_out_of_range_rejected(core: Core) -> None:
    for bad in (-1, 901):
        assert entry_error(core.send(Q, "x", delay_seconds=bad)).code is \
            ErrorCode.INVALID_PARAMETER_VALUE
    assert core.depth(Q) == (0, 0, 0)


# ---- retention ------------------------------------------------------------------------------


def test_retention_expiry_by_sweep(core: Core) -> None:
    core.create("short", MessageRetentionPeriod=60)
    sent_id(core.send("short", "x"))
    core.advance(30)
    keep = sent_id(core.send("short", "y"))
    core.advance(29.999)
    core.run(c.Sweep())
    assert core.depth("short") == (2, 0, 0)
    core.advance(0.001)
    core.run(c.Sweep())
    assert core.depth("short") == (1, 0, 0)
    assert ids(core.receive("short", 10)) == [keep]


def test_retention_expiry_dropped_by_receive(core: Core) -> None:
    core.create("short", MessageRetentionPeriod=60)
    sent_id(core.send("short", "x"))
    core.advance(60)
    assert core.receive("short", 10) == []  # no sweep ran: receive drops it itself
    assert core.depth("short") == (0, 0, 0)


def test_retention_expiry_of_in_flight_message(core: Core) -> None:
    core.create("short", MessageRetentionPeriod=60)
    sent_id(core.send("short", "x"))
    (m,) = core.receive("short", timeout=600)
    core.advance(61)
    core.run(c.Sweep())
    assert core.depth("short") == (0, 0, 0)
    entry_ok(core.delete("short", m.receipt_handle))  # already gone: deleting succeeds
    core.advance(600)
    assert core.receive("short") == []


# ---- purge ----------------------------------------------------------------------------------


def test_purge(core: Core) -> None:
    for i in range(3):
        sent_id(core.send(Q, f"m{i}"))
    sent_id(core.send(Q, "late", delay_seconds=30))
    (m,) = core.receive(Q)
    assert core.depth(Q) == (2, 1, 1)
    assert core.run(c.PurgeQueue(Q)) == c.Ok()
    assert core.depth(Q) == (0, 0, 0)
    assert core.receive(Q, 10) == []
    core.advance(45)
    assert core.receive(Q, 10) == []  # neither the in-flight nor the delayed one comes back
    entry_ok(core.delete(Q, m.receipt_handle))  # an old handle: already gone
    rej = core.run(c.PurgeQueue(Q))
    assert isinstance(rej, Rejection) and rej.code is ErrorCode.PURGE_QUEUE_IN_PROGRESS
    fresh = sent_id(core.send(Q, "after"))
    core.advance(15)
    assert core.run(c.PurgeQueue(Q)) == c.Ok()
    assert core.depth(Q) == (0, 0, 0)
    assert fresh not in ids(core.receive(Q, 10))
    core.run(c.Sweep())
    assert core.depth(Q) == (0, 0, 0)


def test_purge_of_missing_queue() -> None:
    rej = Core().run(c.PurgeQueue("nope"))
    assert isinstance(rej, Rejection) and rej.code is ErrorCode.QUEUE_DOES_NOT_EXIST


def test_messages_sent_after_purge_are_delivered(core: Core) -> None:
    sent_id(core.send(Q, "old"))
    core.run(c.PurgeQueue(Q))
    new = sent_id(core.send(Q, "new"))
    assert ids(core.receive(Q, 10)) == [new]


# ---- dead-letter queues -------------------------------------------------------------------


def test_redrive_moves_message_after_max_receives() -> None:
    k = Core()
    k.create("dlq")
    assert k.create("src", VisibilityTimeout=10, RedrivePolicy=redrive("dlq", 2)) == \
        c.QueueCreated("src")
    mid = sent_id(k.send("src", "poison", message_attributes={"a": "1"}))
    for n in (1, 2):
        (m,) = k.receive("src")
        assert m.message_id == mid and attr(m, "ApproximateReceiveCount") == str(n)
        k.advance(10)
    assert k.receive("src") == []  # the third receive moves it instead
    assert k.depth("src") == (0, 0, 0)
    assert k.depth("dlq") == (1, 0, 0)
    (d,) = k.receive("dlq")
    assert d.message_id == mid and d.body == "poison"
    assert dict(d.message_attributes) == {"a": MessageAttributeValue("String", "1")}
    assert attr(d, "DeadLetterQueueSourceArn") == arn("src")
    k.advance(3600)
    assert k.receive("src") == []


def test_redrive_skips_poison_and_delivers_the_rest() -> None:
    k = Core()
    k.create("dlq")
    k.create("src", VisibilityTimeout=10, RedrivePolicy=redrive("dlq", 1))
    poison = sent_id(k.send("src", "poison"))
    k.receive("src")
    k.advance(10)
    good = sent_id(k.send("src", "good"))
    assert ids(k.receive("src", 10)) == [good]
    assert ids(k.receive("dlq", 10)) == [poison]


def test_redrive_policy_added_later_applies() -> None:
    k = Core()
    k.create("dlq")
    k.create("src", VisibilityTimeout=10)
    mid = sent_id(k.send("src", "x"))
    for _ in range(3):
        k.receive("src")
        k.advance(10)
    assert k.run(c.SetQueueAttributes("src", (("RedrivePolicy", redrive("dlq", 3)),))) == c.Ok()
    assert k.receive("src") == []
    assert ids(k.receive("dlq")) == [mid]


def test_a_queue_may_be_its_own_dead_letter_target() -> None:
    """Amazon accepts it; nothing is ever moved, the message stays deliverable."""
    k = Core()
    assert k.create("src", RedrivePolicy=redrive("src", 1)) == c.QueueCreated("src")
    assert k.run(c.SetQueueAttributes("src", (("RedrivePolicy", redrive("src", 1)),))) == c.Ok()
    mid = sent_id(k.send("src", "x"))
    for _ in range(3):
        assert ids(k.receive("src", 1, timeout=0)) == [mid]


@pytest.mark.parametrize("policy", [
    redrive("missing", 2),
    redrive("dlq.fifo", 2),
    '{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:dlq"}',
    '{"maxReceiveCount":2}',
    redrive("dlq", 0),
    "not json",
])
def test_redrive_policy_validation(policy: str) -> None:
    k = Core()
    k.create("dlq")
    k.create("dlq.fifo", FifoQueue="true")
    rej = k.create("src", RedrivePolicy=policy)
    assert isinstance(rej, Rejection) and rej.code is ErrorCode.INVALID_PARAMETER_VALUE, rej
    assert isinstance(k.attrs("dlq"), dict)
    missing = k.run(c.CreateQueue("src"))
    assert missing == c.QueueCreated("src")  # nothing of the failed create stayed behind
    rej = k.run(c.SetQueueAttributes("src", (("RedrivePolicy", policy),)))
    assert isinstance(rej, Rejection) and rej.code is ErrorCode.INVALID_PARAMETER_VALUE, rej
    assert "RedrivePolicy" not in k.attrs("src")


def test_fifo_source_needs_fifo_dlq() -> None:
    k = Core()
    k.create("dlq")
    rej = k.create("src.fifo", FifoQueue="true", RedrivePolicy=redrive("dlq", 2))
    assert isinstance(rej, Rejection) and rej.code is ErrorCode.INVALID_PARAMETER_VALUE


# ---- depth counters through the lifecycle ---------------------------------------------------


def test_depth_counters_through_lifecycle(core: Core) -> None:
    assert core.depth(Q) == (0, 0, 0)
    sent_id(core.send(Q, "a"))
    sent_id(core.send(Q, "b"))
    sent_id(core.send(Q, "c", delay_seconds=10))
    assert core.depth(Q) == (2, 0, 1)
    m1, m2 = core.receive(Q, 2, timeout=20)
    assert core.depth(Q) == (0, 2, 1)
    core.advance(10)
    assert core.depth(Q) == (1, 2, 0)  # the delayed one is due
    entry_ok(core.delete(Q, m1.receipt_handle))
    assert core.depth(Q) == (1, 1, 0)
    entry_ok(core.change(Q, m2.receipt_handle, 0))
    assert core.depth(Q) == (2, 0, 0)
    (m3,) = core.receive(Q, 1, timeout=5)
    assert core.depth(Q) == (1, 1, 0)
    core.advance(5)
    assert core.depth(Q) == (2, 0, 0)
    core.run(c.Sweep())
    assert core.depth(Q) == (2, 0, 0)
    for m in core.receive(Q, 10):
        entry_ok(core.delete(Q, m.receipt_handle))
    assert core.depth(Q) == (0, 0, 0)


# ---- request-id deduplication on standard queues ------------------------------------------


def _send_req(core: Core, body: str, request_id: str, queue: str = Q) -> c.Result:
    return core.run(c.SendMessages(queue, (c.SendEntry("0", body),), request_id))


def test_request_id_dedup(core: Core) -> None:
    first = sent_id(_send_req(core, "x", "req-1"))
    core.advance(60)
    assert sent_id(_send_req(core, "x", "req-1")) == first
    assert core.depth(Q) == (1, 0, 0)
    other = sent_id(_send_req(core, "x", "req-2"))
    assert other != first
    assert core.depth(Q) == (2, 0, 0)
    # No request id: every send is a new message.
    sent_id(_send_req(core, "x", ""))
    sent_id(_send_req(core, "x", ""))
    assert core.depth(Q) == (4, 0, 0)


def test_request_id_dedup_holds_after_delete_and_expires(core: Core) -> None:
    first = sent_id(_send_req(core, "x", "req-1"))
    (m,) = core.receive(Q)
    entry_ok(core.delete(Q, m.receipt_handle))
    assert sent_id(_send_req(core, "x", "req-1")) == first
    assert core.depth(Q) == (0, 0, 0)
    core.advance(300)
    again = sent_id(_send_req(core, "x", "req-1"))
    assert again != first
    assert core.depth(Q) == (1, 0, 0)


def test_request_id_dedup_is_per_queue(core: Core) -> None:
    core.create("other")
    a = sent_id(_send_req(core, "x", "req-1"))
    b = sent_id(_send_req(core, "x", "req-1", queue="other"))
    assert a != b
    assert core.depth(Q) == core.depth("other") == (1, 0, 0)


def test_request_id_dedup_batch_maps_each_entry(core: Core) -> None:
    entries = (c.SendEntry("a", "1"), c.SendEntry("b", "2"))
    first = core.run(c.SendMessages(Q, entries, "req"))
    again = core.run(c.SendMessages(Q, entries, "req"))
    assert isinstance(first, c.BatchResult) and isinstance(again, c.BatchResult)
    assert [(s.entry_id, s.message_id) for s in first.successful] == \
        [(s.entry_id, s.message_id) for s in again.successful]
    assert core.depth(Q) == (2, 0, 0)


# ---- batches --------------------------------------------------------------------------------


def test_batch_partial_failure(core: Core) -> None:
    entries = (c.SendEntry("a", "good one"), c.SendEntry("b", "bad \x00 char"),
               c.SendEntry("c", "good two"))
    res = core.run(c.SendMessages(Q, entries))
    assert isinstance(res, c.BatchResult)
    assert [s.entry_id for s in res.successful] == ["a", "c"]
    (f,) = res.failed
    assert f.entry_id == "b" and f.rejection.code is ErrorCode.INVALID_MESSAGE_CONTENTS
    assert sorted(m.body for m in core.receive(Q, 10)) == ["good one", "good two"]


def test_delete_batch_partial_failure(core: Core) -> None:
    sent_id(core.send(Q, "a"))
    sent_id(core.send(Q, "b"))
    m1, m2 = core.receive(Q, 2)
    res = core.run(c.DeleteMessages(Q, (("x", m1.receipt_handle), ("y", "garbage"),
                                        ("z", m2.receipt_handle))))
    assert isinstance(res, c.BatchResult)
    assert res.successful == ("x", "z")
    assert [(f.entry_id, f.rejection.code) for f in res.failed] == \
        [("y", ErrorCode.RECEIPT_HANDLE_IS_INVALID)]
    assert core.depth(Q) == (0, 0, 0)


def test_change_visibility_batch_partial_failure(core: Core) -> None:
    sent_id(core.send(Q, "a"))
    sent_id(core.send(Q, "b"))
    m1, m2 = core.receive(Q, 2, timeout=100)
    res = core.run(c.ChangeVisibilities(Q, (("x", m1.receipt_handle, 0), ("y", "garbage", 0),
                                            ("z", m2.receipt_handle, 50_000))))
    assert isinstance(res, c.BatchResult)
    assert res.successful == ("x",)
    assert [(f.entry_id, f.rejection.code) for f in res.failed] == [
        ("y", ErrorCode.RECEIPT_HANDLE_IS_INVALID), ("z", ErrorCode.INVALID_PARAMETER_VALUE)]
    assert core.depth(Q) == (1, 1, 0)


# ---- bad input leaves messages untouched ---------------------------------------------------


def _bad_inputs(core: Core) -> list[tuple[c.Command, ErrorCode]]:
    return [
        (c.SendMessages(Q, ()), ErrorCode.EMPTY_BATCH_REQUEST),
        (c.SendMessages(Q, tuple(c.SendEntry(str(i), "x") for i in range(11))),
         ErrorCode.TOO_MANY_ENTRIES_IN_BATCH_REQUEST),
        (c.SendMessages(Q, (c.SendEntry("a", "x"), c.SendEntry("a", "y"))),
         ErrorCode.BATCH_ENTRY_IDS_NOT_DISTINCT),
        (c.SendMessages(Q, (c.SendEntry("bad id!", "x"),)), ErrorCode.INVALID_BATCH_ENTRY_ID),
        (c.SendMessages(Q, (c.SendEntry("a", "x" * 600_000), c.SendEntry("b", "y" * 600_000))),
         ErrorCode.BATCH_REQUEST_TOO_LONG),
        (c.SendMessages("nope", (c.SendEntry("0", "x"),)), ErrorCode.QUEUE_DOES_NOT_EXIST),
        (c.ReceiveMessages("nope"), ErrorCode.QUEUE_DOES_NOT_EXIST),
        (c.DeleteMessages("nope", (("0", "h"),)), ErrorCode.QUEUE_DOES_NOT_EXIST),
        (c.ChangeVisibilities("nope", (("0", "h", 1),)), ErrorCode.QUEUE_DOES_NOT_EXIST),
        (c.CreateQueue(Q, (("VisibilityTimeout", "31"),)), ErrorCode.QUEUE_ALREADY_EXISTS),
        (c.CreateQueue(Q, (("Bogus", "1"),)), ErrorCode.INVALID_ATTRIBUTE_NAME),
        (c.CreateQueue("bad name"), ErrorCode.INVALID_PARAMETER_VALUE),
        (c.SetQueueAttributes(Q, (("VisibilityTimeout", "-1"),)),
         ErrorCode.INVALID_ATTRIBUTE_VALUE),
        (c.SetQueueAttributes(Q, (("FifoQueue", "true"),)), ErrorCode.INVALID_ATTRIBUTE_NAME),
        (c.SetQueueAttributes(Q, (("RedrivePolicy", redrive("nope", 1)),)),
         ErrorCode.INVALID_PARAMETER_VALUE),
        (c.SetQueueAttributes("nope", (("VisibilityTimeout", "1"),)),
         ErrorCode.QUEUE_DOES_NOT_EXIST),
        (c.DeleteQueue("nope"), ErrorCode.QUEUE_DOES_NOT_EXIST),
        (c.TagQueue(Q, tuple((f"k{i}", "v") for i in range(51))),
         ErrorCode.INVALID_PARAMETER_VALUE),
    ]


def test_bad_input_leaves_messages_untouched(core: Core) -> None:
    sent_id(core.send(Q, "a"))
    sent_id(core.send(Q, "b"))
    sent_id(core.send(Q, "c", delay_seconds=100))
    (held,) = core.receive(Q, 1, timeout=50)
    core.create("tiny", MaximumMessageSize=1024)
    before = core.depth(Q), core.attrs(Q)["VisibilityTimeout"]
    for cmd, code in _bad_inputs(core):
        res = core.run(cmd)
        if isinstance(res, c.BatchResult):
            assert res.successful == () and len(res.failed) == 1, (cmd, res)
            res = res.failed[0].rejection
        assert isinstance(res, Rejection), (cmd, res)
        assert res.code is code, (type(cmd).__name__, res)
        assert (core.depth(Q), core.attrs(Q)["VisibilityTimeout"]) == before, cmd
    # Single-entry rejections inside a batch, and receipt handle errors.
    for res, code in [
        (core.send(Q, ""), ErrorCode.MISSING_PARAMETER),
        (core.send(Q, "x\x01"), ErrorCode.INVALID_MESSAGE_CONTENTS),
        (core.send(Q, "x", message_deduplication_id="d"), ErrorCode.INVALID_PARAMETER_VALUE),
        (core.send(Q, "x", delay_seconds=1000), ErrorCode.INVALID_PARAMETER_VALUE),
        (core.send(Q, "x", message_attributes={"": "v"}), ErrorCode.INVALID_PARAMETER_VALUE),
        (core.delete(Q, "garbage"), ErrorCode.RECEIPT_HANDLE_IS_INVALID),
        (core.change(Q, "garbage", 5), ErrorCode.RECEIPT_HANDLE_IS_INVALID),
        (core.change(Q, held.receipt_handle, 43_201), ErrorCode.INVALID_PARAMETER_VALUE),
        (core.send("tiny", "x" * 1025), ErrorCode.INVALID_PARAMETER_VALUE),
    ]:
        assert entry_error(res).code is code, res
        assert (core.depth(Q), core.attrs(Q)["VisibilityTimeout"]) == before
    # And the held message is still held with its original deadline.
    core.advance(49)
    assert core.receive(Q, 10) != [] and core.depth(Q) == (0, 2, 1)
    core.advance(1)
    (again,) = core.receive(Q, 10)
    assert again.message_id == held.message_id


def test_receive_that_finds_more_due_than_it_takes_wakes_other_long_polls(core: Core) -> None:
    for i in range(3):
        sent_id(core.send(Q, f"m{i}"))
    core.receive(Q, 3, timeout=10)
    core.advance(10)  # all three come back; nothing has swept them yet
    core.effects.clear()
    assert len(core.receive(Q, 1, timeout=10)) == 1
    assert c.WakeReceivers(Q) in core.effects  # two are left for whoever is parked
    core.advance(10)
    core.effects.clear()
    assert len(core.receive(Q, 10)) == 3  # took all that came due: nobody to wake
    assert c.WakeReceivers(Q) not in core.effects


def test_aws_trace_header_travels_with_the_message() -> None:
    k = Core()
    k.create("dlq")
    k.create("src", RedrivePolicy=json.dumps({
        "deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:dlq", "maxReceiveCount": 1}))
    trace = "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"
    res = k.run(c.SendMessages("src", (c.SendEntry("0", "x", aws_trace_header=trace),)))
    assert isinstance(res, c.BatchResult)
    (sent,) = res.successful
    assert sent.md5_of_message_system_attributes == md5_of_message_attributes(
        {"AWSTraceHeader": MessageAttributeValue("String", trace)})
    (m,) = k.receive("src", timeout=0)
    assert dict(m.attributes)["AWSTraceHeader"] == trace
    assert k.receive("src") == []  # dead-lettered, trace header and all
    (moved,) = k.receive("dlq")
    assert dict(moved.attributes)["AWSTraceHeader"] == trace
    untraced = k.run(c.SendMessages("dlq", (c.SendEntry("0", "y"),)))
    assert isinstance(untraced, c.BatchResult)
    assert untraced.successful[0].md5_of_message_system_attributes is None
    huge = k.run(c.SendMessages("dlq", (c.SendEntry("0", "z", aws_trace_header="x" * 9000),)))
    assert isinstance(huge, c.BatchResult)
    assert huge.failed[0].rejection.code is ErrorCode.INVALID_PARAMETER_VALUE


def test_receive_over_the_in_flight_limit_is_over_limit(core: Core,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "IN_FLIGHT_MAX", 3)  # SQS's is 120,000; the rule is the same
    for i in range(5):
        sent_id(core.send(Q, f"m{i}"))
    assert len(core.receive(Q, 10, timeout=30)) == 3  # no more than the room left
    rej = core.run(c.ReceiveMessages(Q, 1, 30))
    assert isinstance(rej, Rejection) and rej.code is ErrorCode.OVER_LIMIT
    assert core.depth(Q) == (2, 3, 0)  # the refused receive took nothing
    core.advance(30)  # back they come: room again
    assert len(core.receive(Q, 10)) == 3
