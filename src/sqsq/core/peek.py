"""Peek: a queue's oldest messages as they stand, for an operator's eyes (the web console).

A read-only query, like ``queries``: it changes no delivery state, receive count or
visibility, and is never logged. It walks the retention index (oldest first), so its first
entry also gives the age of the oldest message. Each message's state is evaluated as of
``now``, as ``queries.depth`` counts it: a timer that is due but not yet swept reads visible.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqsq.core import keys
from sqsq.core.delivery import due_ms
from sqsq.core.queues import queue_does_not_exist
from sqsq.core.records import DELAYED, IN_FLIGHT
from sqsq.core.state import ShardState
from sqsq.errors import ErrorCode, Rejection, reject

PEEK_MAX_MESSAGES = 10
# Bodies are cut here: a page of ten 1 MiB bodies helps no one and would pass gRPC's 4 MiB.
PEEK_BODY_MAX_CHARS = 4096
# Retention-index entries looked at per peek, live or stale: a bound on the work of one call.
PEEK_SCAN_BUDGET = 1000

VISIBLE_STATE, IN_FLIGHT_STATE, DELAYED_STATE = "visible", "in flight", "delayed"


@dataclass(frozen=True)
class PeekedMessage:
    message_id: str
    body: str  # at most PEEK_BODY_MAX_CHARS
    body_truncated: bool
    sent_ms: int  # when retention started counting (the send, or a FIFO dead-letter move)
    state: str  # VISIBLE_STATE, IN_FLIGHT_STATE or DELAYED_STATE, as of the peek
    receive_count: int
    visible_at_ms: int  # in flight or delayed: when it shows again; visible: 0
    group_id: str | None = None
    dead_letter_source_arn: str | None = None


@dataclass(frozen=True)
class Peek:
    messages: tuple[PeekedMessage, ...]
    oldest_sent_ms: int | None  # the oldest message's retention start; None: queue empty
    now_ms: int


def check_max(max_messages: int) -> Rejection | None:
    if not 0 <= max_messages <= PEEK_MAX_MESSAGES:
        return reject(ErrorCode.INVALID_PARAMETER_VALUE,
                      f"Value {max_messages} for parameter MaxNumberOfMessages is invalid. "
                      f"Reason: Must be between 0 and {PEEK_MAX_MESSAGES}.")
    return None


def peek_messages(st: ShardState, name: str, max_messages: int, now: int) -> Peek | Rejection:
    """Up to ``max_messages`` of queue ``name``'s messages, oldest first (0: only the oldest
    message's age), without receiving them."""
    rejection = check_max(max_messages)
    if rejection is not None:
        return rejection
    q = st.queue(name)
    if q is None:
        return queue_does_not_exist()
    out: list[PeekedMessage] = []
    oldest: int | None = None
    for looked, (key, _) in enumerate(st.scan_index("r", q.qid)):
        if looked >= PEEK_SCAN_BUDGET or len(out) >= max_messages and oldest is not None:
            break
        seq = keys.seq_of(key)
        d = st.delivery(q.qid, seq)
        m = st.message(q.qid, seq) if d is not None else None
        if d is None or m is None:
            continue  # removed, its retention entry not yet swept
        if oldest is None:
            oldest = d.sent_ms
        if len(out) >= max_messages:
            continue
        state, at = VISIBLE_STATE, 0
        if d.state in (DELAYED, IN_FLIGHT) and due_ms(q, d) > now:
            state = DELAYED_STATE if d.state == DELAYED else IN_FLIGHT_STATE
            at = due_ms(q, d)
        out.append(PeekedMessage(
            m.message_id, m.body[:PEEK_BODY_MAX_CHARS], len(m.body) > PEEK_BODY_MAX_CHARS,
            d.sent_ms, state, d.receive_count, at, m.group_id, m.dead_letter_source_arn))
    return Peek(tuple(out), oldest, now)
