"""The delivery state machine of one message, as pure functions of (state, command, now).

    DELAYED(visible_at) ──due──► VISIBLE ──receive──► IN_FLIGHT(epoch, deadline) ──delete──► gone
                                   ▲                      │
                                   └──deadline passes, ───┘
                                      or visibility 0
    VISIBLE ──receive with receive count ≥ maxReceiveCount──► dead-letter queue (same MessageId)
    any ──retention expiry or purge──► gone

Standard queues deliver from the visible index in (visible_at, seq) order. FIFO queues keep
each message group's messages in send order and a ready index of groups that are not blocked
(no message in flight) and whose head is visible. Timers (delays and visibility deadlines)
live in one index per queue ordered by deadline; a due timer is materialised when a receive
or a sweep reaches it, so a receive never scans deleted or in-flight messages.
Receiving (and the dead-letter move it makes) is in ``receiving.py``; delete and visibility
changes, fenced by the receipt handle, are in ``fencing.py``.
"""

from __future__ import annotations

from sqsq.core import keys
from sqsq.core import records as r
from sqsq.core.keys import TIMER_DELAYED, TIMER_IN_FLIGHT
from sqsq.core.records import (
    DELAYED,
    IN_FLIGHT,
    VISIBLE,
    Delivery,
    GroupRecord,
    MessageRecord,
    QueueRecord,
)
from sqsq.core.state import ShardState

# Amazon's FIFO sequence numbers are large 20-digit numbers; ours count up from this base,
# spaced like theirs, and stay 20 digits for 2**46 messages.
SEQUENCE_NUMBER_BASE = 18_000_000_000_000_000_000
SEQUENCE_NUMBER_STEP = 2**16


def sequence_number(seq: int) -> str:
    return str(SEQUENCE_NUMBER_BASE + seq * SEQUENCE_NUMBER_STEP)


# ---- placing a message --------------------------------------------------------------------


def enqueue(
    st: ShardState,
    q: QueueRecord,
    m: MessageRecord,
    *,
    visible_at: int,
    now: int,
    receive_count: int = 0,
    first_receive_ms: int = 0,
    enqueued_ms: int | None = None,
) -> int:
    """Store a new message in queue ``q`` and index it; returns its seq.

    Retention counts from ``enqueued_ms``: the send time, except where SQS restarts the clock
    (a FIFO message moved to a dead-letter queue).
    """
    return place(st, q, m.encode(), m.group_id, m.sent_ms if enqueued_ms is None else enqueued_ms,
                 visible_at=visible_at, now=now, receive_count=receive_count,
                 first_receive_ms=first_receive_ms)


def place(
    st: ShardState,
    q: QueueRecord,
    message: bytes,
    group_id: str | None,
    enqueued: int,
    *,
    visible_at: int,
    now: int,
    receive_count: int = 0,
    first_receive_ms: int = 0,
) -> int:
    """``enqueue`` of a message record already encoded (``message``), with its group and the
    time its retention counts from: a send builds the bytes, not the record."""
    seq = st.next_seq()
    qid = q.qid
    fifo = q.attributes.fifo_queue
    group = group_id if fifo else None
    state = DELAYED if visible_at > now else VISIBLE
    put = st.txn.put
    put(keys.message_key(qid, seq), message)
    put(keys.delivery_key(qid, seq), r.pack([state, visible_at if state == DELAYED else now,
                                          receive_count, first_receive_ms, group, enqueued,
                                          0]))  # Delivery.encode, without the record
    put(keys.retention_key(qid, enqueued, seq), b"")
    counters = st.counters(qid)  # the index floors below: each only ever lowered here
    if enqueued < counters.r_floor:
        counters.r_floor = enqueued
    if state == DELAYED and fifo:
        # A FIFO queue's delay is retroactive in SQS: index by send time, and let the queue's
        # delay as it is when the timer is looked at decide when that is due.
        assert enqueued == now, "only a send delays a FIFO message"
        put(keys.fifo_delay_key(qid, now, seq), b"")
        if now < counters.y_floor:
            counters.y_floor = now
    elif state == DELAYED:
        put(keys.timer_key(qid, visible_at, seq), TIMER_DELAYED)
        if visible_at < counters.w_floor:
            counters.w_floor = visible_at
    elif not fifo:
        put(keys.visible_key(qid, now, seq), b"")
        if now < counters.v_floor:
            counters.v_floor = now
    if fifo:
        new_group = st.txn.get(st.group_key(qid, group)) is None
        if new_group:  # an empty group starts here
            st.put_group(qid, group, GroupRecord(floor=seq))
        put(keys.group_message_key(qid, group, seq), b"")
        if state == VISIBLE and new_group:
            # Only a message that starts its group is its head: seqs only grow, so any other
            # is the group's last, and the head (and whether the group is ready) is as it was.
            refresh_group(st, qid, group, now)
    if state == VISIBLE:  # Counters.add, inline: one call fewer for every message sent
        counters.visible += 1
    else:
        counters.delayed += 1
    return seq


def remove(st: ShardState, q: QueueRecord, seq: int, d: Delivery, now: int) -> None:
    """Forget a message entirely: record, state and every index entry that points at it."""
    qid = q.qid
    was_head = False
    if d.group_id is not None:
        was_head = st.group_head(qid, d.group_id) == seq
    delete = st.txn.delete
    delete(keys.message_key(qid, seq))
    delete(keys.delivery_key(qid, seq))
    delete(keys.retention_key(qid, d.sent_ms, seq))
    if d.state == VISIBLE:
        if d.group_id is None:
            delete(keys.visible_key(qid, d.visible_at_ms, seq))
    elif d.state == DELAYED and d.group_id is not None:
        delete(keys.fifo_delay_key(qid, d.sent_ms, seq))
    else:
        delete(keys.timer_key(qid, d.visible_at_ms, seq))
    counters = st.counters(qid)
    if d.state == VISIBLE:  # Counters.add, inline: one call fewer for every message deleted
        counters.visible -= 1
    elif d.state == IN_FLIGHT:
        counters.in_flight -= 1
    else:
        counters.delayed -= 1
    if d.group_id is not None:
        delete(keys.group_message_key(qid, d.group_id, seq))
        g = st.group(qid, d.group_id)
        if d.state == IN_FLIGHT:
            g.in_flight -= 1
        if was_head:
            g.head_since_ms = now  # the next message is the head from now on
        st.put_group(qid, d.group_id, g)
        if was_head:  # any other message's leaving keeps the head, and whether it is ready
            refresh_group(st, qid, d.group_id, now)


def make_visible(st: ShardState, q: QueueRecord, seq: int, d: Delivery, at: int) -> None:
    """A delayed or in-flight message becomes visible at ``at`` (its timer entry is gone).

    A standard message back from in flight takes its original place (its send time), ahead
    of messages sent after it, as Amazon does (best effort there too).
    """
    was = d.state
    if was == IN_FLIGHT and d.group_id is None:
        at = d.sent_ms
    d.state, d.visible_at_ms = VISIBLE, at
    st.put_delivery(q.qid, seq, d)
    counters = st.counters(q.qid)
    counters.add(was, -1)
    counters.add(VISIBLE, 1)
    if d.group_id is None:
        st.txn.put(keys.visible_key(q.qid, at, seq), b"")
        st.lower_floor(q.qid, "v_floor", at)
        return
    if was == IN_FLIGHT:
        g = st.group(q.qid, d.group_id)
        g.in_flight -= 1
        st.put_group(q.qid, d.group_id, g)
    refresh_group(st, q.qid, d.group_id, at)


def hide(st: ShardState, q: QueueRecord, seq: int, d: Delivery, deadline: int) -> None:
    """A visible standard message is in flight again until ``deadline``, its receive count
    unchanged (ChangeMessageVisibility with the latest handle after the timeout ran out)."""
    assert d.state == VISIBLE and d.group_id is None
    st.txn.delete(keys.visible_key(q.qid, d.visible_at_ms, seq))
    d.state, d.visible_at_ms = IN_FLIGHT, deadline
    st.put_delivery(q.qid, seq, d)
    st.txn.put(keys.timer_key(q.qid, deadline, seq), TIMER_IN_FLIGHT)
    st.lower_floor(q.qid, "w_floor", deadline)
    counters = st.counters(q.qid)
    counters.add(VISIBLE, -1)
    counters.add(IN_FLIGHT, 1)


def refresh_group(st: ShardState, qid: int, group: str, since_ms: int) -> bool:
    """Keep a FIFO group's entry in the ready index iff its head (oldest message) is visible.

    As in Amazon, blocking is per message: a receive walks the group from its head and stops
    at the first message that is not visible, so a group whose head is visible again is
    receivable even while later messages are in flight. Groups are served in the order they
    became receivable (``since_ms``: when the head became visible, or became the head); a
    group that stays receivable keeps its place, one that was received from goes to the back.
    """
    head_seq = st.group_head(qid, group)
    g = st.group(qid, group)
    want = None
    if head_seq is not None:
        head = st.delivery(qid, head_seq)
        if head is not None and head.state == VISIBLE:
            if g.ready_key is not None and keys.ready_group_of(g.ready_key)[0] == head_seq:
                want = g.ready_key
            else:
                since = max(since_ms, g.head_since_ms)
                want = keys.ready_group_key(qid, since, head_seq, group)
                st.lower_floor(qid, "k_floor", since)
    if g.ready_key != want:
        if g.ready_key is not None:
            st.txn.delete(g.ready_key)
        if want is not None:
            st.txn.put(want, b"")
        g.ready_key = want
    if head_seq is None and g.in_flight == 0:
        st.txn.delete(st.group_key(qid, group))
    else:
        st.put_group(qid, group, g)
    return want is not None


def due_ms(q: QueueRecord, d: Delivery) -> int:
    """When a delayed or in-flight message becomes visible (a FIFO delay follows the queue's
    DelaySeconds as it is now; everything else was fixed when the timer was set)."""
    if d.state == DELAYED and d.group_id is not None:
        return d.sent_ms + q.attributes.delay_seconds * 1000
    return d.visible_at_ms


def fifo_delay_cutoff(q: QueueRecord, now: int) -> int | None:
    """FIFO messages sent at or before this are past the queue's current delay (None: none
    can be, or not a FIFO queue)."""
    if not q.attributes.fifo_queue:
        return None
    cutoff = now - q.attributes.delay_seconds * 1000
    return cutoff if cutoff >= 0 else None


def promote_due(st: ShardState, q: QueueRecord, now: int, budget: int) -> int:
    """Materialise timers that are due: delayed and timed-out messages become visible."""
    # An index whose floor is past the cutoff has nothing due (its scan would read nothing
    # and leave the floor where it is): every receive asks, and usually nothing is due.
    counters = st.counters(q.qid)
    n = _fire(st, q, "w", now, 0, budget) if counters.w_floor <= now else 0
    cutoff = fifo_delay_cutoff(q, now)
    if cutoff is not None and counters.y_floor <= cutoff:
        n += _fire(st, q, "y", cutoff, q.attributes.delay_seconds * 1000, budget - n)
    return n


def _fire(st: ShardState, q: QueueRecord, index: str, until: int, offset_ms: int,
          budget: int) -> int:
    """A timer index's entries (qid, time, seq) up to ``until``: each message becomes visible
    at its time + ``offset_ms``."""
    n = 0
    for key, _ in st.scan_index(index, q.qid, until):
        if n >= budget:
            break
        seq, at = keys.seq_of(key), keys.read_u64(key, 9)
        st.txn.delete(key)
        d = st.delivery(q.qid, seq)
        if d is not None:
            make_visible(st, q, seq, d, at + offset_ms)
        n += 1
    return n


def settle_floors(st: ShardState, q: QueueRecord) -> None:
    """Raise the timer indexes' floors to their first live keys (or to empty), so the queue's
    place in the sweep schedule is when its next timer is really due."""
    for index in ("w", "y", "r") if q.attributes.fifo_queue else ("w", "r"):
        next(iter(st.scan_index(index, q.qid)), None)


def drop_expired(st: ShardState, q: QueueRecord, now: int, budget: int) -> int:
    """Retention: messages sent more than MessageRetentionPeriod ago are gone."""
    cutoff = now - q.attributes.message_retention_period_s * 1000
    n = 0
    if cutoff < 0:
        return 0
    for key, _ in st.scan_index("r", q.qid, cutoff):
        if n >= budget:
            break
        seq = keys.seq_of(key)
        d = st.delivery(q.qid, seq)
        if d is None:
            st.txn.delete(key)
        else:
            remove(st, q, seq, d, now)
        n += 1
    return n


def move_deadline(st: ShardState, q: QueueRecord, seq: int, d: Delivery, deadline: int) -> None:
    """An in-flight message comes back at ``deadline`` instead."""
    st.txn.delete(keys.timer_key(q.qid, d.visible_at_ms, seq))
    d.visible_at_ms = deadline
    st.put_delivery(q.qid, seq, d)
    st.txn.put(keys.timer_key(q.qid, deadline, seq), TIMER_IN_FLIGHT)
    st.lower_floor(q.qid, "w_floor", deadline)
