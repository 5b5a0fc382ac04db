"""FIFO queues through the pure core: group order, group blocking, deduplication."""

from __future__ import annotations

import pytest

from coresupport import Core
from sqsq.core import commands as c
from sqsq.core import limits
from sqsq.errors import ErrorCode, Rejection

F = "orders.fifo"


def sent(res: c.Result) -> c.SentMessage:
    assert isinstance(res, c.BatchResult), res
    assert not res.failed, res.failed
    (one,) = res.successful
    return one


def entry_error(res: c.Result) -> Rejection:
    assert isinstance(res, c.BatchResult), res
    assert res.successful == (), res
    (f,) = res.failed
    return f.rejection


def entry_ok(res: c.Result) -> None:
    assert isinstance(res, c.BatchResult) and res.successful == ("0",) and not res.failed, res


def attr(m: c.ReceivedMessage, name: str) -> str:
    return dict(m.attributes)[name]


def bodies(msgs: list) -> list[str]:
    return [m.body for m in msgs]


def arn(name: str) -> str:
    return f"arn:aws:sqs:us-east-1:000000000000:{name}"


def make(**attrs: object) -> Core:
    k = Core()
    attrs.setdefault("ContentBasedDeduplication", "true")
    assert k.create(F, FifoQueue="true", **attrs) == c.QueueCreated(F)
    return k


def put(k: Core, body: str, group: str, dedup: str | None = None, queue: str = F) -> c.SentMessage:
    return sent(k.send(queue, body, message_group_id=group, message_deduplication_id=dedup))


# ---- order and group blocking -----------------------------------------------------------


def test_order_within_group() -> None:
    k = make()
    for i in range(5):
        put(k, f"a{i}", "A")
    got = []
    while True:
        msgs = k.receive(F, 1)
        if not msgs:
            break
        got += bodies(msgs)
        entry_ok(k.delete(F, msgs[0].receipt_handle))
    assert got == [f"a{i}" for i in range(5)]


def test_big_messages_of_a_group_come_in_order_in_replies_that_fit() -> None:
    # A receive of ten 1 MiB messages of one group once failed "too large" after making
    # them invisible, again and again: the group never moved. It takes what fits, in order.
    k = make(VisibilityTimeout=30)
    body = "x" * (limits.MAXIMUM_MESSAGE_SIZE_BYTES[1] - 100)
    for i in range(10):
        put(k, f"{i:02d}{body}", "A", dedup=f"d{i}")
    got = []
    while msgs := k.receive(F, 10):
        assert sum(len(m.body) for m in msgs) <= limits.RECEIVE_REPLY_MAX_BYTES
        got += [m.body[:2] for m in msgs]
        for m in msgs:
            entry_ok(k.delete(F, m.receipt_handle))
    assert got == [f"{i:02d}" for i in range(10)]


def test_group_blocked_while_in_flight_others_served() -> None:
    k = make(VisibilityTimeout=30)
    put(k, "a1", "A")
    put(k, "a2", "A")
    put(k, "b1", "B")
    put(k, "b2", "B")
    (a1,) = k.receive(F, 1)
    assert a1.body == "a1"
    # A is blocked behind a1; B is served, in order, and then blocked too.
    (b1,) = k.receive(F, 1)
    assert b1.body == "b1"
    assert k.receive(F, 10) == []
    entry_ok(k.delete(F, b1.receipt_handle))
    assert bodies(k.receive(F, 10)) == ["b2"]
    assert k.receive(F, 10) == []
    entry_ok(k.delete(F, a1.receipt_handle))
    assert bodies(k.receive(F, 10)) == ["a2"]


def test_group_unblocks_on_timeout_and_redelivers_same_message() -> None:
    k = make(VisibilityTimeout=10)
    put(k, "a1", "A")
    put(k, "a2", "A")
    (m,) = k.receive(F, 1)
    k.advance(9)
    assert k.receive(F, 10) == []
    k.advance(1)
    msgs = k.receive(F, 1)
    assert bodies(msgs) == ["a1"]  # a1 again, never a2 ahead of it
    assert attr(msgs[0], "ApproximateReceiveCount") == "2"
    assert entry_error(k.delete(F, m.receipt_handle)).code is ErrorCode.INVALID_PARAMETER_VALUE


def test_a_timed_out_handle_no_longer_deletes() -> None:
    """As Amazon answers on FIFO queues: once the visibility timeout ran out, the handle has
    expired even though nobody received the message since; the message stays."""
    k = make(VisibilityTimeout=10)
    put(k, "a1", "A")
    (m,) = k.receive(F, 1)
    k.advance(10)
    rej = entry_error(k.delete(F, m.receipt_handle))
    assert rej.code is ErrorCode.INVALID_PARAMETER_VALUE
    assert rej.message == (f"Value {m.receipt_handle} for parameter ReceiptHandle is invalid. "
                           "Reason: The receipt handle has expired.")
    k.run(c.Sweep())
    assert entry_error(k.delete(F, m.receipt_handle)).code is ErrorCode.INVALID_PARAMETER_VALUE
    (again,) = k.receive(F, 1)
    assert again.message_id == m.message_id
    entry_ok(k.delete(F, again.receipt_handle))


def test_one_receive_returns_consecutive_messages_of_a_group() -> None:
    k = make()
    for i in range(4):
        put(k, f"a{i}", "A")
    msgs = k.receive(F, 3)
    assert bodies(msgs) == ["a0", "a1", "a2"]
    assert k.receive(F, 10) == []  # a3 waits behind the in-flight ones
    for m in msgs[:2]:
        entry_ok(k.delete(F, m.receipt_handle))
    assert k.receive(F, 10) == []  # a2 still in flight
    entry_ok(k.delete(F, msgs[2].receipt_handle))
    assert bodies(k.receive(F, 10)) == ["a3"]


def test_receive_spans_groups_in_order() -> None:
    k = make()
    put(k, "a1", "A")
    put(k, "b1", "B")
    put(k, "a2", "A")
    put(k, "c1", "C")
    msgs = k.receive(F, 10)
    got = bodies(msgs)
    assert sorted(got) == ["a1", "a2", "b1", "c1"]
    assert got.index("a1") < got.index("a2")
    for m in msgs:
        assert attr(m, "MessageGroupId") == m.body[0].upper()


def test_visibility_zero_releases_group_in_order() -> None:
    k = make()
    put(k, "a1", "A")
    put(k, "a2", "A")
    m1, m2 = k.receive(F, 2, timeout=100)
    entry_ok(k.change(F, m2.receipt_handle, 0))
    assert k.receive(F, 10) == []  # a1 is still in flight: the group stays blocked
    entry_ok(k.change(F, m1.receipt_handle, 0))
    assert bodies(k.receive(F, 10)) == ["a1", "a2"]


def test_released_head_is_received_again_while_follower_in_flight() -> None:
    """Blocking is per message, as in Amazon: a receive walks a group from its head and stops
    at the first message in flight, so an older message visible again is received again."""
    k = make()
    put(k, "a1", "A")
    put(k, "a2", "A")
    put(k, "b1", "B")
    m1, m2 = k.receive(F, 2, timeout=100)
    assert bodies([m1, m2]) == ["a1", "a2"]
    k.advance(1)
    entry_ok(k.change(F, m1.receipt_handle, 0))
    # A is receivable again, behind B (receivable since b1 was sent): A goes to the back.
    again = k.receive(F, 10)
    assert bodies(again) == ["b1", "a1"]  # a1 only: a2 is still in flight
    assert attr(again[1], "ApproximateReceiveCount") == "2"
    assert k.receive(F, 10) == []
    entry_ok(k.delete(F, m2.receipt_handle))
    entry_ok(k.delete(F, again[1].receipt_handle))
    assert k.receive(F, 10) == []


def test_groups_are_served_in_the_order_they_became_receivable() -> None:
    k = make()
    put(k, "a1", "A")
    put(k, "a2", "A")
    put(k, "b1", "B")
    (m,) = k.receive(F, 1, timeout=100)
    assert m.body == "a1"
    k.advance(1)
    put(k, "c1", "C")
    k.advance(1)
    entry_ok(k.delete(F, m.receipt_handle))  # A is receivable again, after B and C
    assert bodies(k.receive(F, 10)) == ["b1", "c1", "a2"]


def test_delete_behind_in_flight_head_keeps_group_blocked() -> None:
    k = make()
    put(k, "a1", "A")
    put(k, "a2", "A")
    put(k, "a3", "A")
    m1, m2 = k.receive(F, 2, timeout=100)
    entry_ok(k.delete(F, m2.receipt_handle))
    assert k.receive(F, 10) == []
    k.advance(100)
    assert bodies(k.receive(F, 10)) == ["a1", "a3"]


def test_sequence_numbers_increase() -> None:
    k = make()
    seqs = [int(put(k, f"m{i}", "AB"[i % 2]).sequence_number or "") for i in range(6)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 6
    msgs = k.receive(F, 10)
    for m in msgs:
        assert len(attr(m, "SequenceNumber")) == 20
    by_body = {m.body: int(attr(m, "SequenceNumber")) for m in msgs}
    assert [by_body[f"m{i}"] for i in range(6)] == seqs


def test_queue_delay_blocks_nothing_in_other_groups() -> None:
    k = make(DelaySeconds=10)
    put(k, "a1", "A")
    k.advance(5)
    put(k, "b1", "B")
    assert k.depth(F) == (0, 0, 2)
    k.advance(5)
    assert bodies(k.receive(F, 10)) == ["a1"]  # b1 is still delayed; a1 is not held by it
    k.advance(5)
    assert bodies(k.receive(F, 10)) == ["b1"]


def test_delayed_message_waits_in_its_group() -> None:
    k = make(DelaySeconds=10)
    put(k, "a1", "A")
    k.advance(5)
    put(k, "a2", "A")
    k.advance(5)
    msgs = k.receive(F, 10)
    assert bodies(msgs) == ["a1"]
    entry_ok(k.delete(F, msgs[0].receipt_handle))
    assert k.receive(F, 10) == []
    k.advance(5)
    assert bodies(k.receive(F, 10)) == ["a2"]


# ---- deduplication ------------------------------------------------------------------------


def test_dedup_by_explicit_id() -> None:
    k = make(ContentBasedDeduplication="false")
    first = put(k, "one", "A", dedup="d1")
    k.advance(100)
    dup = put(k, "different body", "B", dedup="d1")
    assert (dup.message_id, dup.sequence_number) == (first.message_id, first.sequence_number)
    assert dup.md5_of_message_body == first.md5_of_message_body
    assert k.depth(F) == (1, 0, 0)
    msgs = k.receive(F, 10)
    assert bodies(msgs) == ["one"]
    entry_ok(k.delete(F, msgs[0].receipt_handle))
    # Still a duplicate after the first was deleted: not delivered again.
    again = put(k, "one", "A", dedup="d1")
    assert again.message_id == first.message_id
    assert k.receive(F, 10) == [] and k.depth(F) == (0, 0, 0)


def test_content_based_dedup() -> None:
    k = make()
    first = put(k, "same", "A")
    assert put(k, "same", "A").message_id == first.message_id
    assert put(k, "same", "B").message_id == first.message_id  # queue scope: any group
    other = put(k, "other", "A")
    assert other.message_id != first.message_id
    assert bodies(k.receive(F, 10)) == ["same", "other"]


def test_explicit_id_overrides_content() -> None:
    k = make()
    a = put(k, "same", "A", dedup="x1")
    b = put(k, "same", "A", dedup="x2")
    assert a.message_id != b.message_id
    assert k.depth(F) == (2, 0, 0)


@pytest.mark.parametrize("sweep", [False, True])
def test_dedup_expires_after_five_minutes(sweep: bool) -> None:
    k = make()
    first = put(k, "same", "A")
    k.advance(299.999)
    if sweep:
        k.run(c.Sweep())
    assert put(k, "same", "A").message_id == first.message_id
    k.advance(0.001)
    if sweep:
        k.run(c.Sweep())
    second = put(k, "same", "A")
    assert second.message_id != first.message_id
    assert k.depth(F) == (2, 0, 0)
    # The new message opened a new window.
    k.advance(299)
    assert put(k, "same", "A").message_id == second.message_id


def test_purge_clears_dedup() -> None:
    """As Amazon was recorded doing: after a purge, a deduplication id used before it sends
    a new message."""
    k = make()
    first = put(k, "same", "A")
    assert k.run(c.PurgeQueue(F)) == c.Ok()
    second = put(k, "same", "A")
    assert second.message_id != first.message_id
    assert put(k, "same", "A").message_id == second.message_id  # a new window, deduplicating
    assert bodies(k.receive(F, 10)) == ["same"]
    k.advance(300)
    k.run(c.Sweep())  # the purged incarnation's records leave through their expiry index
    assert k.depth(F) == (1, 0, 0)  # the new message, back from its visibility timeout


def test_dedup_is_per_queue() -> None:
    k = make()
    k.create("other.fifo", FifoQueue="true", ContentBasedDeduplication="true")
    a = put(k, "same", "A")
    b = put(k, "same", "A", queue="other.fifo")
    assert a.message_id != b.message_id


def test_dedup_scope_message_group() -> None:
    k = make(DeduplicationScope="messageGroup", FifoThroughputLimit="perMessageGroupId")
    a = put(k, "same", "A", dedup="d")
    b = put(k, "same", "B", dedup="d")
    assert a.message_id != b.message_id
    assert put(k, "same", "A", dedup="d").message_id == a.message_id
    assert put(k, "x", "B", dedup="d").message_id == b.message_id
    assert k.depth(F) == (2, 0, 0)


def test_dedup_in_batch() -> None:
    k = make()
    res = k.run(c.SendMessages(F, (
        c.SendEntry("a", "same", message_group_id="G"),
        c.SendEntry("b", "same", message_group_id="G"),
        c.SendEntry("c", "new", message_group_id="G"),
    )))
    assert isinstance(res, c.BatchResult) and not res.failed
    a, b, cc = res.successful
    assert a.message_id == b.message_id != cc.message_id
    assert bodies(k.receive(F, 10)) == ["same", "new"]


# ---- validation ---------------------------------------------------------------------------


def test_per_message_delay_rejected_but_an_explicit_zero() -> None:
    k = make(DelaySeconds="10")
    rej = entry_error(k.send(F, "x", message_group_id="A", delay_seconds=5))
    assert rej.code is ErrorCode.INVALID_PARAMETER_VALUE
    assert k.depth(F) == (0, 0, 0)
    # SQS accepts DelaySeconds=0 on a FIFO message (SDK wrappers send it); the queue's delay
    # still applies.
    sent(k.send(F, "x", message_group_id="A", delay_seconds=0))
    assert k.depth(F) == (0, 0, 1)
    k.advance(10)
    assert bodies(k.receive(F)) == ["x"]


def test_message_group_id_required() -> None:
    k = make()
    assert entry_error(k.send(F, "x")).code is ErrorCode.MISSING_PARAMETER
    assert k.depth(F) == (0, 0, 0)


def test_dedup_id_required_without_content_based() -> None:
    k = make(ContentBasedDeduplication="false")
    assert entry_error(k.send(F, "x", message_group_id="A")).code is \
        ErrorCode.INVALID_PARAMETER_VALUE
    assert k.depth(F) == (0, 0, 0)


@pytest.mark.parametrize("field", ["message_group_id", "message_deduplication_id"])
@pytest.mark.parametrize("value", ["", "has space", "é", "x" * 129])
def test_bad_fifo_ids_rejected(field: str, value: str) -> None:
    k = make()
    kw = {"message_group_id": "A", field: value}
    assert entry_error(k.send(F, "x", **kw)).code is ErrorCode.INVALID_PARAMETER_VALUE
    assert k.depth(F) == (0, 0, 0)


def test_rejected_send_does_not_claim_dedup_id() -> None:
    k = make(ContentBasedDeduplication="false")
    assert entry_error(k.send(F, "bad\x00", message_group_id="A",
                              message_deduplication_id="d")).code is \
        ErrorCode.INVALID_MESSAGE_CONTENTS
    put(k, "good", "A", dedup="d")
    assert bodies(k.receive(F)) == ["good"]


# ---- redrive -----------------------------------------------------------------------------


def test_fifo_redrive_keeps_group_order() -> None:
    k = Core()
    k.create("dlq.fifo", FifoQueue="true")
    policy = f'{{"deadLetterTargetArn":"{arn("dlq.fifo")}","maxReceiveCount":1}}'
    k.create(F, FifoQueue="true", ContentBasedDeduplication="true", VisibilityTimeout=10,
             RedrivePolicy=policy)
    for i in range(3):
        put(k, f"a{i}", "A")
    put(k, "b0", "B")
    first = k.receive(F, 10)
    assert sorted(bodies(first)) == ["a0", "a1", "a2", "b0"]
    assert [b for b in bodies(first) if b[0] == "a"] == ["a0", "a1", "a2"]
    k.advance(10)
    assert k.receive(F, 10) == []  # every message was received once: all move
    assert k.depth(F) == (0, 0, 0)
    assert k.depth("dlq.fifo") == (4, 0, 0)
    moved = k.receive("dlq.fifo", 10)
    a_moved = [m for m in moved if attr(m, "MessageGroupId") == "A"]
    assert bodies(a_moved) == ["a0", "a1", "a2"]
    for m in moved:
        assert attr(m, "DeadLetterQueueSourceArn") == arn(F)
    # The moved group is blocked in the DLQ like any other FIFO group.
    assert k.receive("dlq.fifo", 10) == []
    ids = {m.body: m.message_id for m in first}
    assert {m.body: m.message_id for m in moved} == ids


def test_fifo_redrive_partial_group_stays_ordered() -> None:
    k = Core()
    k.create("dlq.fifo", FifoQueue="true")
    policy = f'{{"deadLetterTargetArn":"{arn("dlq.fifo")}","maxReceiveCount":2}}'
    k.create(F, FifoQueue="true", ContentBasedDeduplication="true", VisibilityTimeout=10,
             RedrivePolicy=policy)
    put(k, "a0", "A")
    put(k, "a1", "A")
    assert bodies(k.receive(F, 1)) == ["a0"]
    k.advance(10)
    assert bodies(k.receive(F, 1)) == ["a0"]
    k.advance(10)
    # a0 has been received twice: it moves, and a1 becomes the group's head at once.
    assert bodies(k.receive(F, 1)) == ["a1"]
    assert bodies(k.receive("dlq.fifo", 10)) == ["a0"]


@pytest.mark.parametrize(("source", "dlq", "survives"), [
    ("src.fifo", "dead.fifo", True),  # FIFO: the enqueue time restarts at the move
    ("src", "dead", False),  # standard: retention still counts from the original send
])
def test_dead_letter_retention_clock(source: str, dlq: str, survives: bool) -> None:
    k = Core()
    fifo = {"FifoQueue": "true", "ContentBasedDeduplication": "true"} if survives else {}
    k.create(dlq, MessageRetentionPeriod=60, **fifo)
    policy = f'{{"deadLetterTargetArn":"{arn(dlq)}","maxReceiveCount":1}}'
    k.create(source, RedrivePolicy=policy, **fifo)
    k.send(source, "poison", **({"message_group_id": "g"} if survives else {}))
    k.advance(50)
    assert len(k.receive(source, timeout=0)) == 1
    assert k.receive(source) == []  # the second receive moves it
    k.advance(30)  # 80 s after the send, 30 s after the move
    k.run(c.Sweep())
    got = k.receive(dlq)
    assert bodies(got) == (["poison"] if survives else [])


# ---- ReceiveRequestAttemptId ------------------------------------------------------------


def receive_attempt(k: Core, attempt: str, n: int = 10, timeout: int = 30) -> list:
    res = k.run(c.ReceiveMessages(F, n, timeout, receive_request_attempt_id=attempt))
    assert isinstance(res, c.Received)
    return list(res.messages)


def test_retried_attempt_gets_the_same_answer_and_a_fresh_timeout() -> None:
    k = make()
    for body in ("a1", "a2", "b1"):
        put(k, body, group=body[0])
    first = receive_attempt(k, "try-1", n=2)
    assert [m.body for m in first] == ["a1", "a2"]
    k.advance(20)
    again = receive_attempt(k, "try-1", n=2)  # the answer was lost; the consumer retries
    assert again == first  # same messages, same receipt handles, same receive count
    k.advance(29)  # the retry started the 30 s over: not back yet at 49 s
    assert [m.body for m in receive_attempt(k, "other", n=10)] == ["b1"]
    k.advance(1)
    back = receive_attempt(k, "later", n=10)
    assert [m.body for m in back] == ["a1", "a2"]
    assert [m.attributes for m in back] != [m.attributes for m in first]  # received again


def test_attempt_after_a_change_is_a_new_receive() -> None:
    k = make()
    put(k, "a1", group="a")
    put(k, "a2", group="a")
    (m1,) = receive_attempt(k, "t", n=1)
    entry_ok(k.delete(F, m1.receipt_handle))
    (m2,) = receive_attempt(k, "t", n=1)  # the first answer is gone: receive anew
    assert m2.body == "a2"
    assert receive_attempt(k, "t", n=1) == [m2]  # and that answer is the one remembered


def test_attempt_window_is_five_minutes() -> None:
    k = make(VisibilityTimeout="900")
    put(k, "a1", group="a")
    put(k, "b1", group="b")
    (first,) = receive_attempt(k, "t", n=1, timeout=900)
    k.advance(301)
    k.run(c.Sweep())  # also forgets the attempt
    (second,) = receive_attempt(k, "t", n=1, timeout=900)
    assert (first.body, second.body) == ("a1", "b1")


def test_attempt_id_ignored_on_standard_queues_and_empty_answers() -> None:
    k = Core()
    k.create("std")
    res = k.run(c.ReceiveMessages("std", 1, 30, receive_request_attempt_id="t"))
    assert res == c.Received(())
    k2 = make()
    assert receive_attempt(k2, "t") == []
    put(k2, "a1", group="a")
    assert [m.body for m in receive_attempt(k2, "t")] == ["a1"]  # an empty answer is no answer


def test_attempt_after_a_visibility_change_is_a_new_receive() -> None:
    k = make()
    put(k, "a1", group="a")
    put(k, "b1", group="b")
    (m,) = receive_attempt(k, "t", n=1, timeout=30)
    entry_ok(k.change(F, m.receipt_handle, 600))  # the consumer extends its hold
    (other,) = receive_attempt(k, "t", n=1, timeout=30)  # not the first answer again
    assert other.body == "b1"
    k.advance(31)
    assert bodies(receive_attempt(k, "later")) == ["b1"]  # a1's 600 s extension stands


# ---- queue delay: retroactive on FIFO queues (SQS), not on standard ones ----------------------


def test_fifo_queue_delay_change_applies_to_waiting_messages() -> None:
    k = make(DelaySeconds="900")
    put(k, "early", "A")
    assert k.depth(F) == (0, 0, 1)
    assert k.run(c.SetQueueAttributes(F, (("DelaySeconds", "0"),))) == c.Ok()
    assert k.depth(F) == (1, 0, 0)  # due at once under the new delay
    assert bodies(k.receive(F)) == ["early"]


def test_fifo_queue_delay_lengthened_holds_waiting_messages_longer() -> None:
    k = make(DelaySeconds="10")
    put(k, "m", "A")
    k.advance(5)
    assert k.run(c.SetQueueAttributes(F, (("DelaySeconds", "60"),))) == c.Ok()
    k.advance(5)
    k.run(c.Sweep())
    assert k.receive(F) == [] and k.depth(F) == (0, 0, 1)
    k.advance(50)  # 60 s after the send
    assert bodies(k.receive(F)) == ["m"]


def test_standard_queue_delay_is_fixed_at_send() -> None:
    k = Core()
    k.create("std", DelaySeconds="900")
    k.send("std", "early")
    assert k.run(c.SetQueueAttributes("std", (("DelaySeconds", "0"),))) == c.Ok()
    assert k.receive("std") == [] and k.depth("std") == (0, 0, 1)
    k.advance(900)
    assert [m.body for m in k.receive("std")] == ["early"]


def test_delayed_fifo_message_past_retention_is_gone_for_good() -> None:
    k = make(DelaySeconds="900", MessageRetentionPeriod="60")
    put(k, "old", "A")
    k.advance(60)
    k.run(c.Sweep())
    assert k.depth(F) == (0, 0, 0)
    assert k.run(c.SetQueueAttributes(F, (("DelaySeconds", "0"),))) == c.Ok()
    assert k.receive(F) == [] and k.depth(F) == (0, 0, 0)  # no index entry was left behind
    put(k, "new", "A", dedup="fresh")
    assert bodies(k.receive(F)) == ["new"]
