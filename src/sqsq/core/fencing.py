"""DeleteMessage and ChangeMessageVisibility: transitions fenced by the receipt handle.

A handle carries the epoch (receive count) of the receive that issued it. Only the latest
epoch may delete or change visibility; a handle superseded by a later receive fails with
"expired" and changes nothing; a handle for a message that is already gone deletes "again"
successfully, as SQS does.

Timed-out handles, as Amazon answers: on a FIFO queue the handle of a message whose
visibility timeout ran out no longer deletes it (even if nobody received it since); on a
standard queue the latest handle still changes its visibility (hiding it again).
"""

from __future__ import annotations

from sqsq.core import keys, limits
from sqsq.core.commands import (
    BatchResult,
    ChangeVisibilities,
    DeleteMessages,
    EntryFailed,
    Outcome,
    WakeReceivers,
)
from sqsq.core.delivery import hide, make_visible, move_deadline, remove
from sqsq.core.receipts import decode_receipt, queue_name_hash
from sqsq.core.records import IN_FLIGHT, VISIBLE, QueueRecord
from sqsq.core.state import ShardState
from sqsq.errors import ErrorCode, Rejection, reject


def _handle_for(st: ShardState, q: QueueRecord, text: str, name_hash: int | None = None,
                ) -> tuple[int, int, int] | Rejection:
    """(queue id, seq, epoch) of a handle issued by this shard for this queue's name
    (``name_hash``: the name's hash, if the caller has it)."""
    h = decode_receipt(st.config.secret, text)
    if name_hash is None:
        name_hash = queue_name_hash(q.name)
    if h is None or h[4] != name_hash or h[0] != st.config.shard_id:
        return reject(
            ErrorCode.RECEIPT_HANDLE_IS_INVALID,
            f'The input receipt handle "{text}" is not a valid receipt handle.',
        )
    return h[1], h[2], h[3]


def _expired(text: str) -> Rejection:
    return reject(
        ErrorCode.INVALID_PARAMETER_VALUE,
        f"Value {text} for parameter ReceiptHandle is invalid. Reason: The receipt handle has "
        "expired.",
    )


def delete(st: ShardState, q: QueueRecord, cmd: DeleteMessages, now: int) -> Outcome:
    ok: list[str] = []
    failed: list[EntryFailed] = []
    effects: list[WakeReceivers] = []
    name_hash = queue_name_hash(q.name)
    for entry_id, text in cmd.entries:
        h = _handle_for(st, q, text, name_hash)
        if isinstance(h, Rejection):
            failed.append(EntryFailed(entry_id, h))
            continue
        queue_id, seq, epoch = h
        d = st.delivery(q.qid, seq) if queue_id == q.qid else None
        if d is not None and d.receive_count != epoch:
            failed.append(EntryFailed(entry_id, _expired(text)))
            continue
        if d is not None and q.attributes.fifo_queue and \
                (d.state != IN_FLIGHT or d.visible_at_ms <= now):
            failed.append(EntryFailed(entry_id, _expired(text)))  # its timeout ran out
            continue
        if d is not None:  # already gone (deleted, purged, expired): deleting again succeeds
            remove(st, q, seq, d, now)
            if d.group_id is not None:
                effects.append(WakeReceivers(q.name))
        ok.append(entry_id)
    return Outcome(BatchResult(tuple(ok), tuple(failed)), tuple(set(effects)))


def change_visibility(st: ShardState, q: QueueRecord, cmd: ChangeVisibilities, now: int) -> Outcome:
    ok: list[str] = []
    failed: list[EntryFailed] = []
    effects: list[WakeReceivers] = []
    lo, hi, _ = limits.VISIBILITY_TIMEOUT_S
    for entry_id, text, timeout_s in cmd.entries:
        if not lo <= timeout_s <= hi:
            failed.append(EntryFailed(entry_id, reject(
                ErrorCode.INVALID_PARAMETER_VALUE,
                f"Value {timeout_s} for parameter VisibilityTimeout is invalid. Reason: Must be "
                f"between {lo} and {hi}.")))
            continue
        h = _handle_for(st, q, text)
        if isinstance(h, Rejection):
            failed.append(EntryFailed(entry_id, h))
            continue
        queue_id, seq, epoch = h
        d = st.delivery(q.qid, seq) if queue_id == q.qid else None
        if d is None:
            failed.append(EntryFailed(entry_id, reject(
                ErrorCode.INVALID_PARAMETER_VALUE,
                f"Value {text} for parameter ReceiptHandle is invalid. Reason: Message does not "
                "exist or is not available for visibility timeout change.")))
            continue
        if d.receive_count != epoch:
            failed.append(EntryFailed(entry_id, _expired(text)))
            continue
        timed_out = not q.attributes.fifo_queue and (d.state == VISIBLE or (
            d.state == IN_FLIGHT and d.visible_at_ms <= now))
        if (d.state != IN_FLIGHT or d.visible_at_ms <= now) and not timed_out:
            failed.append(EntryFailed(entry_id, reject(
                ErrorCode.MESSAGE_NOT_INFLIGHT, "The message referred to isn't in flight.")))
            continue
        if d.received_ms and now + timeout_s * 1000 > d.received_ms + hi * 1000:
            # SQS counts the 12-hour maximum from the receive, and refuses rather than clips.
            failed.append(EntryFailed(entry_id, reject(
                ErrorCode.INVALID_PARAMETER_VALUE,
                f"Value {timeout_s} for parameter VisibilityTimeout is invalid. Reason: Total "
                f"VisibilityTimeout for the message is beyond the limit [{hi} seconds]")))
            continue
        if d.state == VISIBLE:  # a standard message whose timeout ran out
            if timeout_s > 0:
                hide(st, q, seq, d, now + timeout_s * 1000)
        elif timeout_s == 0:
            st.txn.delete(keys.timer_key(q.qid, d.visible_at_ms, seq))
            # Timed out but not yet swept: visible since its deadline, as the sweep would say.
            make_visible(st, q, seq, d, min(now, d.visible_at_ms))
            effects.append(WakeReceivers(q.name))
        else:
            move_deadline(st, q, seq, d, now + timeout_s * 1000)
        ok.append(entry_id)
    return Outcome(BatchResult(tuple(ok), tuple(failed)), tuple(set(effects)))
