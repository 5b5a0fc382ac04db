"""SendMessage / SendMessageBatch: validation, deduplication, placement."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType

from sqsq.core import keys, limits
from sqsq.core import records as r
from sqsq.core.commands import (
    BatchResult,
    EntryFailed,
    Outcome,
    SendEntry,
    SendMessages,
    SentMessage,
    WakeReceivers,
)
from sqsq.core.delivery import place, sequence_number
from sqsq.core.messages import (
    MessageAttributeValue,
    check_message,
    content_deduplication_id,
    md5_of_body,
    md5_of_message_attributes,
    md5_of_message_system_attributes,
    message_size,
    utf8_len,
    validate_batch_entry_ids,
    validate_fifo_id,
)
from sqsq.core.records import DedupRecord, MessageRecord, QueueRecord
from sqsq.core.state import ShardState
from sqsq.errors import ErrorCode, Rejection, reject

# Scope marker for client request ids on standard queues; group ids are printable, never \x01.
_REQUEST_SCOPE = "\x01"


def _invalid(message: str) -> Rejection:
    return reject(ErrorCode.INVALID_PARAMETER_VALUE, message)


def _dedup_scope(q: QueueRecord, e: SendEntry) -> tuple[str, str] | Rejection:
    """(scope, deduplication id) for a FIFO entry."""
    a = q.attributes
    dedup_id = e.message_deduplication_id
    if dedup_id is None:
        if not a.content_based_deduplication:
            return _invalid(
                "The queue should either have ContentBasedDeduplication enabled or "
                "MessageDeduplicationId provided explicitly"
            )
        dedup_id = content_deduplication_id(e.body)
    in_effect = a.deduplication_scope_in_effect or a.deduplication_scope
    scope = e.message_group_id if in_effect == "messageGroup" else ""
    return scope or "", dedup_id


_NO_ATTRIBUTES: Mapping[str, MessageAttributeValue] = MappingProxyType({})


def entry_size(e: SendEntry) -> int:
    """``message_size`` of an entry (no dict built for one without attributes)."""
    attrs = e.message_attributes
    return message_size(e.body, dict(attrs)) if attrs else utf8_len(e.body)


def check_entry(q: QueueRecord, e: SendEntry) -> Rejection | None:
    """Everything about one entry that does not depend on other messages."""
    a = q.attributes
    attrs = e.message_attributes
    rej = check_message(e.body, dict(attrs) if attrs else _NO_ATTRIBUTES, a.maximum_message_size)
    if rej is not None:
        return rej
    if e.aws_trace_header is not None and \
            not 0 < len(e.aws_trace_header) <= limits.AWS_TRACE_HEADER_MAX_LEN:
        # Not counted in the message size, as in SQS, but bounded like everything else.
        return _invalid(f"The message system attribute AWSTraceHeader must be 1 to "
                        f"{limits.AWS_TRACE_HEADER_MAX_LEN} characters.")
    lo, hi, _ = limits.DELAY_SECONDS
    if e.delay_seconds is not None:
        if a.fifo_queue and e.delay_seconds != 0:  # SQS lets an explicit 0 through
            return _invalid(
                f"Value {e.delay_seconds} for parameter DelaySeconds is invalid. Reason: The "
                "request include parameter that is not valid for this queue type."
            )
        if not lo <= e.delay_seconds <= hi:
            return _invalid(
                f"Value {e.delay_seconds} for parameter DelaySeconds is invalid. Reason: "
                f"DelaySeconds must be >= {lo} and <= {hi}."
            )
    if a.fifo_queue:
        if e.message_group_id is None:
            return reject(ErrorCode.MISSING_PARAMETER,
                          "The request must contain the parameter MessageGroupId.")
        for value, name in (
            (e.message_group_id, "MessageGroupId"),
            (e.message_deduplication_id, "MessageDeduplicationId"),
        ):
            if value is not None and (rej := validate_fifo_id(value, name)) is not None:
                return rej
        scope = _dedup_scope(q, e)
        if isinstance(scope, Rejection):
            return scope
    else:
        if e.message_deduplication_id is not None:
            return _invalid(
                "The request include parameter MessageDeduplicationId that is not valid for "
                "this queue type."
            )
        if e.message_group_id is not None and (
            rej := validate_fifo_id(e.message_group_id, "MessageGroupId")
        ):
            return rej
    return None


def check_batch(cmd: SendMessages) -> Rejection | None:
    rej = validate_batch_entry_ids([e.entry_id for e in cmd.entries])
    if rej is not None:
        return rej
    if len(cmd.entries) == 1:
        return None  # a single message is held to MaximumMessageSize by check_entry
    total = sum(map(entry_size, cmd.entries))
    if total > limits.MAXIMUM_MESSAGE_SIZE_BYTES[1]:
        return reject(
            ErrorCode.BATCH_REQUEST_TOO_LONG,
            f"Batch requests cannot be longer than {limits.MAXIMUM_MESSAGE_SIZE_BYTES[1]} bytes."
            f" You have sent {total} bytes.",
        )
    return None


def send(st: ShardState, q: QueueRecord, cmd: SendMessages, now: int) -> Outcome:
    if len(cmd.message_ids) != len(cmd.entries):
        raise AssertionError("the leader stamps one message id per entry")
    fifo = q.attributes.fifo_queue
    ok: list[SentMessage] = []
    failed: list[EntryFailed] = []
    woke = False
    for e, message_id in zip(cmd.entries, cmd.message_ids, strict=True):
        rej = check_entry(q, e)
        if rej is not None:
            failed.append(EntryFailed(e.entry_id, rej))
            continue
        dedup_id = None
        ukey = None
        if fifo:
            scope, dedup_id = _dedup_scope(q, e)  # type: ignore[misc]  # checked above
            ukey = keys.dedup_key(q.qid, scope, dedup_id)  # a purge starts a new window
        elif cmd.request_id:
            ukey = keys.dedup_key(q.dedup_scope_qid, _REQUEST_SCOPE,
                               f"{cmd.request_id}/{e.entry_id}")
        if ukey is not None:
            raw = st.txn.get(ukey)
            if raw is not None:
                first = DedupRecord.decode(raw)
                if first.expires_ms > now:  # a duplicate: the first message's answer, no new one
                    ok.append(SentMessage(e.entry_id, first.message_id, first.md5_of_message_body,
                                          first.md5_of_message_attributes, first.sequence_number,
                                          md5_of_message_system_attributes(e.aws_trace_header)))
                    continue
        attrs, trace = e.message_attributes, e.aws_trace_header
        # Both digests are None without attributes (or a trace header): not worth a call.
        md5_attrs = md5_of_message_attributes(dict(attrs)) if attrs else None
        md5 = md5_of_body(e.body)
        group = e.message_group_id
        raw = MessageRecord.encode_fields(message_id, e.body, attrs, now, md5, md5_attrs, group,
                                          dedup_id, aws_trace_header=trace)
        delay_s = q.attributes.delay_seconds if fifo or e.delay_seconds is None \
            else e.delay_seconds
        seq = place(st, q, raw, group, now, visible_at=now + delay_s * 1000, now=now)
        woke = woke or delay_s == 0
        seq_no = sequence_number(seq) if fifo else None
        ok.append(SentMessage(e.entry_id, message_id, md5, md5_attrs, seq_no,
                              None if trace is None else md5_of_message_system_attributes(trace)))
        if ukey is not None:
            expires = now + limits.DEDUPLICATION_WINDOW_MS
            st.txn.put(ukey, DedupRecord.encode_fields(message_id, seq_no, md5, md5_attrs,
                                                       expires))
            expire_window_at(st, ukey, expires)
    effects = (WakeReceivers(q.name),) if woke else ()
    return Outcome(BatchResult(tuple(ok), tuple(failed)), effects)


def expire_window_at(st: ShardState, key: bytes, expires_ms: int) -> None:
    """Index a windowed record (a dedup record or a receive attempt) for expire_dedup."""
    st.txn.put(keys.dedup_expiry_key(expires_ms, key), b"")
    meta = st.meta
    if expires_ms < meta.e_floor:
        meta.e_floor = expires_ms


def due_dedup(st: ShardState, now: int) -> Iterator[tuple[bytes, bytes]]:
    """Expiry index entries that are due, from the floor (see records.Meta.e_floor)."""
    meta = st.meta
    return st.scan_floored(b"e", meta.e_floor, now,
                           lambda floor: setattr(meta, "e_floor", floor))


def expire_dedup(st: ShardState, now: int, budget: int) -> int:
    """Forget deduplication records and receive attempts whose 5-minute window has passed."""
    n = 0
    for key, _ in due_dedup(st, now):
        if n >= budget:
            break
        ukey = key[9:]
        raw = st.txn.get(ukey)
        if raw is not None and r.window_expires_ms(ukey, raw) <= now:
            st.txn.delete(ukey)
        st.txn.delete(key)
        n += 1
    return n
