"""ReceiveMessage: claim visible messages (a FIFO queue's in group order), move those that
reached maxReceiveCount to the dead-letter queue, and answer a retried FIFO receive
(ReceiveRequestAttemptId) with its first answer. The states it moves messages between are
in ``delivery.py``.
"""

from __future__ import annotations

import dataclasses

from sqsq.core import keys, limits, regions
from sqsq.core import records as r
from sqsq.core.commands import (
    Outcome,
    Received,
    ReceivedMessage,
    ReceiveMessages,
    WakeReceivers,
)
from sqsq.core.delivery import (
    enqueue,
    move_deadline,
    promote_due,
    refresh_group,
    remove,
    sequence_number,
)
from sqsq.core.keys import TIMER_IN_FLIGHT
from sqsq.core.messages import message_size, utf8_len
from sqsq.core.receipts import encode_receipt, queue_name_hash
from sqsq.core.records import IN_FLIGHT, VISIBLE, Delivery, MessageRecord, QueueRecord
from sqsq.core.sending import expire_window_at
from sqsq.core.state import ShardState
from sqsq.errors import ErrorCode, reject


def _dead_letter_queue(st: ShardState, q: QueueRecord) -> QueueRecord | None:
    policy = q.attributes.redrive_policy
    if policy is None:
        return None
    target = st.config.key_of_arn(policy.dead_letter_target_arn)
    if target is None or target == q.name:
        return None
    return st.queue(target)


def _move_to_dead_letter(
    st: ShardState, q: QueueRecord, dlq: QueueRecord, seq: int, d: Delivery, m: MessageRecord,
    now: int,
) -> None:
    remove(st, q, seq, d, now)
    moved = dataclasses.replace(m, dead_letter_source_arn=st.config.queue_arn(q.name),
                                dead_lettered_ms=now)
    # Standard queues keep the original enqueue time for retention; FIFO queues restart it.
    enqueue(st, dlq, moved, visible_at=now, now=now, receive_count=d.receive_count,
            first_receive_ms=d.first_receive_ms,
            enqueued_ms=now if dlq.attributes.fifo_queue else d.sent_ms)


def _claim(
    st: ShardState, q: QueueRecord, seq: int, d: Delivery, m: MessageRecord, now: int,
    timeout_s: int, nonce: int,
) -> ReceivedMessage:
    qid = q.qid
    d.receive_count += 1
    d.first_receive_ms = d.first_receive_ms or now
    d.received_ms = now
    deadline = now + timeout_s * 1000
    d.state, d.visible_at_ms = IN_FLIGHT, deadline
    put = st.txn.put
    put(keys.delivery_key(qid, seq), d.encode())
    put(keys.timer_key(qid, deadline, seq), TIMER_IN_FLIGHT)
    counters = st.counters(qid)
    if deadline < counters.w_floor:
        counters.w_floor = deadline
    counters.visible -= 1
    counters.in_flight += 1
    return _received(st, q, seq, d, m, nonce)


def _received(
    st: ShardState, q: QueueRecord, seq: int, d: Delivery, m: MessageRecord, nonce: int,
) -> ReceivedMessage:
    """What the receiver gets for an in-flight message; equal inputs give an equal handle."""
    config = st.config
    handle = encode_receipt(config.secret, config.shard_id, q.qid, seq, d.receive_count,
                            queue_name_hash(q.name), (nonce ^ seq) & 0xFFFF_FFFF_FFFF_FFFF)
    attrs = [
        ("SenderId", config.account),
        ("SentTimestamp", str(m.sent_ms)),
        ("ApproximateReceiveCount", str(d.receive_count)),
        ("ApproximateFirstReceiveTimestamp", str(d.first_receive_ms)),
    ]
    if q.attributes.fifo_queue:
        attrs += [
            ("MessageGroupId", m.group_id or ""),
            ("MessageDeduplicationId", m.deduplication_id or ""),
            ("SequenceNumber", sequence_number(seq)),
        ]
    elif m.group_id:
        attrs.append(("MessageGroupId", m.group_id))
    if m.dead_letter_source_arn:
        attrs.append(("DeadLetterQueueSourceArn", m.dead_letter_source_arn))
    if m.aws_trace_header is not None:
        attrs.append(("AWSTraceHeader", m.aws_trace_header))
    return ReceivedMessage(
        m.message_id, handle, m.body, m.md5_of_body,
        m.md5_of_message_attributes, m.message_attributes, tuple(attrs),
    )


def _deliverable(
    st: ShardState, q: QueueRecord, dlq: QueueRecord | None, seq: int, now: int,
    effects: list, d: Delivery | None = None,
) -> tuple[Delivery, MessageRecord] | None:
    """The message if it may be handed out now; expired or dead-lettered ones are moved away.
    ``d``: its delivery record, if the caller has just read it."""
    if d is None:
        d = st.delivery(q.qid, seq)
    m = st.message(q.qid, seq)
    if d is None or m is None:
        raise AssertionError(f"index points at a missing message {q.qid}/{seq}")
    if d.sent_ms + q.attributes.message_retention_period_s * 1000 <= now:
        remove(st, q, seq, d, now)
        return None
    policy = q.attributes.redrive_policy
    if dlq is not None and policy is not None and d.receive_count >= policy.max_receive_count:
        _move_to_dead_letter(st, q, dlq, seq, d, m, now)
        effects.append(WakeReceivers(dlq.name))
        return None
    return d, m


class _ReplySize:
    """A receive's messages so far against ``limits.RECEIVE_REPLY_MAX_BYTES``."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0

    def fits(self, m: MessageRecord) -> bool:
        """Whether ``m`` may join the reply (the first always does); counts it if so."""
        attrs = m.message_attributes
        n = message_size(m.body, dict(attrs)) if attrs else utf8_len(m.body)
        if self.total and self.total + n > limits.RECEIVE_REPLY_MAX_BYTES:
            return False
        self.total += n
        return True


def receive(st: ShardState, q: QueueRecord, cmd: ReceiveMessages, now: int) -> Outcome:
    timeout_s = cmd.visibility_timeout_s
    if timeout_s is None:
        timeout_s = q.attributes.visibility_timeout_s
    promoted = promote_due(st, q, now, limits.SWEEP_MAX_ITEMS)
    dlq = _dead_letter_queue(st, q)
    effects: list[WakeReceivers] = []
    if promoted > cmd.max_number_of_messages:
        # More came due than this receive can take: parked long polls may have the rest now,
        # not at the next sweep.
        effects.append(WakeReceivers(q.name))
    attempt_id = cmd.receive_request_attempt_id if q.attributes.fifo_queue else ""
    if attempt_id:
        again = _retried_attempt(st, q, attempt_id, timeout_s, now)
        if again is not None:
            return Outcome(Received(again), tuple(effects))
    room = limits.IN_FLIGHT_MAX - st.counters(q.qid).in_flight
    if room <= 0:
        return Outcome(reject(
            ErrorCode.OVER_LIMIT, f"The maximum number of in flight messages "
            f"({limits.IN_FLIGHT_MAX}) is reached for queue {regions.name_of(q.name)}."),
            tuple(effects))
    out: list[ReceivedMessage] = []
    want, budget = min(cmd.max_number_of_messages, room), limits.RECEIVE_SCAN_MAX
    size = _ReplySize()
    if not q.attributes.fifo_queue:
        for key, _ in st.scan_index("v", q.qid):
            if len(out) >= want or budget <= 0:
                break
            budget -= 1
            seq = keys.seq_of(key)
            got = _deliverable(st, q, dlq, seq, now, effects)
            if got is not None:
                if not size.fits(got[1]):
                    break
                st.txn.delete(key)
                out.append(_claim(st, q, seq, *got, now, timeout_s, cmd.nonce))
                if len(out) >= want:
                    break  # as the loop's own check would, without reading one key more
        return Outcome(Received(tuple(out)), tuple(effects))
    claimed: list[tuple[int, int]] = []  # (seq, receive count): what a retry must find
    for rkey, _ in st.scan_index("k", q.qid):
        if len(out) >= want or budget <= 0:
            break
        group = keys.ready_group_of(rkey)[1]
        for fkey in st.group_messages(q.qid, group):
            if len(out) >= want or budget <= 0:
                break
            budget -= 1
            seq = keys.seq_of(fkey)
            d = st.delivery(q.qid, seq)
            if d is None or d.state != VISIBLE:
                break  # strict order: nothing behind a delayed or in-flight message
            got = _deliverable(st, q, dlq, seq, now, effects, d)
            if got is not None and not size.fits(got[1]):
                budget = 0  # the reply is full: this group and every other wait
                break
            if got is not None:
                out.append(_claim(st, q, seq, *got, now, timeout_s, cmd.nonce))
                claimed.append((seq, got[0].receive_count))
                g = st.group(q.qid, group)
                g.in_flight += 1
                st.put_group(q.qid, group, g)
                if len(out) >= want:
                    break  # as the loop's own check would, without reading one key more
        refresh_group(st, q.qid, group, now)
        if len(out) >= want or budget <= 0:
            break  # likewise
    if attempt_id and claimed:
        key = keys.attempt_key(q.qid, attempt_id)
        expires = now + limits.DEDUPLICATION_WINDOW_MS
        st.txn.put(key, r.ReceiveAttempt(cmd.nonce, claimed, expires,
                                         now + timeout_s * 1000).encode())
        expire_window_at(st, key, expires)
    return Outcome(Received(tuple(out)), tuple(effects))


def _retried_attempt(
    st: ShardState, q: QueueRecord, attempt_id: str, timeout_s: int, now: int,
) -> tuple[ReceivedMessage, ...] | None:
    """SQS's ReceiveRequestAttemptId: within 5 minutes, and while none of the first answer's
    messages was deleted, changed or timed out, a retry gets that answer again (same handles)
    and its visibility timeout starts over. Otherwise the retry is a new receive."""
    raw = st.txn.get(keys.attempt_key(q.qid, attempt_id))
    if raw is None:
        return None
    attempt = r.ReceiveAttempt.decode(raw)
    if attempt.expires_ms <= now:
        return None
    held = []
    for seq, count in attempt.messages:
        d = st.delivery(q.qid, seq)
        if d is None or d.state != IN_FLIGHT or d.receive_count != count or \
                d.visible_at_ms != attempt.deadline_ms or d.visible_at_ms <= now:
            return None  # deleted, received again, visibility changed, or timed out
        held.append((seq, d))
    attempt.deadline_ms = now + timeout_s * 1000
    st.txn.put(keys.attempt_key(q.qid, attempt_id), attempt.encode())
    out = []
    for seq, d in held:
        move_deadline(st, q, seq, d, attempt.deadline_ms)
        m = st.message(q.qid, seq)
        assert m is not None, f"in-flight message {q.qid}/{seq} has no record"
        out.append(_received(st, q, seq, d, m, attempt.nonce))
    return tuple(out)

