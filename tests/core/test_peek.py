"""Peek through the pure core: the oldest messages as they stand, and nothing changed by it."""

from __future__ import annotations

import json

from coresupport import CONFIG, Core
from sqsq.core import commands as c
from sqsq.core import peek
from sqsq.core.machine import effective_now
from sqsq.core.state import ShardState
from sqsq.core.txn import Txn
from sqsq.errors import ErrorCode, Rejection

Q = "jobs"


def look(k: Core, queue: str = Q, n: int = 10) -> peek.Peek:
    """A peek, checking that it left nothing to write."""
    txn = Txn(k.store)
    out = peek.peek_messages(ShardState(txn, CONFIG), queue, n, effective_now(txn, k.now_ms))
    assert txn.writes() == {}, "a peek must not write"
    assert isinstance(out, peek.Peek), out
    return out


def sent_id(res: c.Result) -> str:
    assert isinstance(res, c.BatchResult) and not res.failed, res
    return res.successful[0].message_id


def test_peek_shows_every_state_oldest_first_and_changes_nothing() -> None:
    k = Core()
    k.create(Q, VisibilityTimeout=30)
    first = sent_id(k.send(Q, "first"))
    k.advance(1)
    second = sent_id(k.send(Q, "second"))
    k.advance(1)
    delayed = sent_id(k.send(Q, "later", delay_seconds=60))
    (received,) = k.receive(Q)
    assert received.message_id == first
    depth = k.depth(Q)
    assert depth == (1, 1, 1)

    p = look(k)
    assert [(m.message_id, m.body, m.state, m.receive_count) for m in p.messages] == [
        (first, "first", peek.IN_FLIGHT_STATE, 1),
        (second, "second", peek.VISIBLE_STATE, 0),
        (delayed, "later", peek.DELAYED_STATE, 0),
    ]
    assert p.messages[0].visible_at_ms == k.now_ms + 30_000
    assert p.messages[2].visible_at_ms == k.now_ms + 60_000
    assert p.oldest_sent_ms == k.now_ms - 2000 and p.now_ms == k.now_ms

    # Peeking twice changed nothing: the same counts, the visible message still the next
    # receive's, with its first receive count.
    look(k)
    assert k.depth(Q) == depth
    (m,) = k.receive(Q)
    assert m.message_id == second and dict(m.attributes)["ApproximateReceiveCount"] == "1"


def test_a_due_timer_reads_visible_before_any_sweep() -> None:
    k = Core()
    k.create(Q, VisibilityTimeout=5)
    sent_id(k.send(Q, "a"))
    k.receive(Q)
    k.advance(6)  # past the visibility timeout, nothing has swept the timer
    (m,) = look(k).messages
    assert m.state == peek.VISIBLE_STATE and m.visible_at_ms == 0 and m.receive_count == 1


def test_peek_limits_count_cuts_long_bodies_and_zero_gives_only_the_age() -> None:
    k = Core()
    k.create(Q)
    for i in range(12):
        sent_id(k.send(Q, f"m{i}"))
        k.advance(1)
    p = look(k)
    assert [m.body for m in p.messages] == [f"m{i}" for i in range(10)]
    only_age = look(k, n=0)
    assert only_age.messages == () and only_age.oldest_sent_ms == k.now_ms - 12_000

    k.create("big")
    sent_id(k.send("big", "x" * (peek.PEEK_BODY_MAX_CHARS + 10)))
    (m,) = look(k, "big").messages
    assert len(m.body) == peek.PEEK_BODY_MAX_CHARS and m.body_truncated


def test_deleted_and_purged_messages_are_gone_from_a_peek() -> None:
    k = Core()
    k.create(Q)
    sent_id(k.send(Q, "gone"))
    k.advance(1)
    kept = sent_id(k.send(Q, "kept"))
    (m,) = k.receive(Q)
    assert k.delete(Q, m.receipt_handle) == c.BatchResult(("0",), ())
    p = look(k)
    assert [x.message_id for x in p.messages] == [kept]
    assert p.oldest_sent_ms == k.now_ms  # the oldest left is the second one
    k.run(c.PurgeQueue(Q))
    empty = look(k)
    assert empty.messages == () and empty.oldest_sent_ms is None


def test_fifo_and_dead_letter_details() -> None:
    k = Core()
    k.create("dlq")
    k.create(Q, VisibilityTimeout=0, RedrivePolicy=json.dumps({
        "deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:dlq", "maxReceiveCount": 1}))
    mid = sent_id(k.send(Q, "poison"))
    k.receive(Q)
    assert k.receive(Q) == []  # the second receive moved it
    (m,) = look(k, "dlq").messages
    assert m.message_id == mid and m.dead_letter_source_arn.endswith(":jobs")

    k.create("f.fifo", FifoQueue="true", ContentBasedDeduplication="true")
    sent_id(k.send("f.fifo", "g1", message_group_id="g"))
    (m,) = look(k, "f.fifo").messages
    assert m.group_id == "g" and m.state == peek.VISIBLE_STATE


def test_bad_requests_are_rejected() -> None:
    k = Core()
    k.create(Q)
    txn = Txn(k.store)
    st = ShardState(txn, CONFIG)
    missing = peek.peek_messages(st, "nope", 1, k.now_ms)
    assert isinstance(missing, Rejection) and \
        missing.code is ErrorCode.QUEUE_DOES_NOT_EXIST
    for n in (-1, peek.PEEK_MAX_MESSAGES + 1):
        bad = peek.peek_messages(st, Q, n, k.now_ms)
        assert isinstance(bad, Rejection) and bad.code is ErrorCode.INVALID_PARAMETER_VALUE
