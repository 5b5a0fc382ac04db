"""The batch calls behind automatic batching (``sqsq.client.batching``): single-message
calls of one method to one queue made into one batch call (entry ids "0", "1", ... in call
order), and its answer split back into each caller's own result or error, as the single
call would have ended."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from sqsq.client import _convert
from sqsq.client._call import Call
from sqsq.client.types import BatchResult, SendResult
from sqsq.errors import InternalError, QueueError, error_for
from sqsq.v1 import queues_pb2 as pb

SQS_MAX_ENTRIES = 10
SQS_MAX_BATCH_BYTES = 1_048_576  # a batch's payload, as for one message (SQS since 2025)

_SEND_OPTIONAL = ("delay_seconds", "message_group_id", "message_deduplication_id",
                  "aws_trace_header")
_IDS = tuple(str(i) for i in range(SQS_MAX_ENTRIES))  # a batch's entry ids, made once


def _add_send_entry(entries: Any, i: int, req: pb.SendMessageRequest) -> None:
    """``req`` (a single send's request) as entry ``i`` of a batch, built in its place in the
    repeated field ``entries`` (built apart and passed in, each entry was copied again)."""
    entry = entries.add(id=_IDS[i] if i < SQS_MAX_ENTRIES else str(i),
                        message_body=req.message_body)
    if req.message_attributes:
        for name, value in req.message_attributes.items():
            entry.message_attributes[name].CopyFrom(value)
    has = req.HasField
    for name in _SEND_OPTIONAL:
        if has(name):
            setattr(entry, name, getattr(req, name))


def _send_batch(queue_url: str, reqs: list[Any]) -> Call:
    # One request id for every attempt of this batch: a retry is answered, entry by entry,
    # with the first result (the server keys it by request id and entry id).
    req = pb.SendMessageBatchRequest(queue_url=queue_url, request_id=_convert.request_id())
    entries = req.entries
    for i, r in enumerate(reqs):
        _add_send_entry(entries, i, r)
    return Call("SendMessageBatch", req, _parse_sent, retry=True)


def _parse_sent(resp: pb.SendMessageBatchResponse) -> BatchResult:
    """A batch of single sends' answer, its entries left as they came: each caller's
    ``SendResult`` is made from its own (``_sent``), with no entry object in between."""
    return BatchResult(successful=list(resp.successful),
                       failed=_convert.batch_errors(resp.failed))


def _delete_batch(queue_url: str, reqs: list[Any]) -> Call:
    req = pb.DeleteMessageBatchRequest(queue_url=queue_url)
    add = req.entries.add  # (in place, as the sends' entries)
    for i, r in enumerate(reqs):
        add(id=_IDS[i] if i < SQS_MAX_ENTRIES else str(i), receipt_handle=r.receipt_handle)
    return Call("DeleteMessageBatch", req, _convert.parse_batch, retry=True)  # (as _ops says)


def _change_batch(queue_url: str, reqs: list[Any]) -> Call:
    req = pb.ChangeMessageVisibilityBatchRequest(queue_url=queue_url)
    add = req.entries.add
    for i, r in enumerate(reqs):
        add(id=_IDS[i] if i < SQS_MAX_ENTRIES else str(i), receipt_handle=r.receipt_handle,
            visibility_timeout=r.visibility_timeout)
    return Call("ChangeMessageVisibilityBatch", req, _convert.parse_batch)


def _sent(entry: pb.SendMessageBatchResultEntry) -> SendResult:
    return SendResult(entry.message_id, entry.md5_of_message_body,
                      entry.md5_of_message_attributes or None, entry.sequence_number or None,
                      entry.md5_of_message_system_attributes or None)


def _nothing(_entry: Any) -> None:
    return None


# single method -> (its batch call, a successful batch entry as the single call's result)
_BATCHED: dict[str, tuple[Callable[[str, list[Any]], Call], Callable[[Any], Any]]] = {
    "SendMessage": (_send_batch, _sent),
    "DeleteMessage": (_delete_batch, _nothing),
    "ChangeMessageVisibility": (_change_batch, _nothing),
}


def _utf8_len(text: str) -> int:
    # An ASCII str's UTF-8 length is its length (str.isascii reads a flag the str keeps): no
    # copy of the body just to count it.
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def payload_bytes(call: Call) -> int:
    """A send's size as SQS counts it (UTF-8 body, each attribute's name, type and value);
    0 for the calls that carry no message."""
    if call.method != "SendMessage":
        return 0
    req = call.request
    size = _utf8_len(req.message_body)
    if req.message_attributes:  # (most sends have none)
        for name, value in req.message_attributes.items():
            size += _utf8_len(name) + _utf8_len(value.data_type)
            size += _utf8_len(value.string_value) + len(value.binary_value)
    return size


Outcome = tuple[Any, BaseException | None]  # (result, error): one caller's


def batch_call(calls: Sequence[Call]) -> Call:
    """One batch call for ``calls`` (single calls of one method to one queue), their entries
    in order."""
    first = calls[0]
    make, _ = _BATCHED[first.method]
    return make(first.request.queue_url, [call.request for call in calls])


def settle(method: str, n: int, result: BatchResult) -> list[Outcome]:
    """Each of the ``n`` entries' outcome to its caller (the single ``method``'s result), or
    its failure as a ``QueueError``."""
    _, as_result = _BATCHED[method]
    successful = result.successful
    if not result.failed and len(successful) == n and \
            all(e.id == _IDS[i] for i, e in enumerate(successful)):
        return [(as_result(e), None) for e in successful]  # the usual answer: all, in order
    ok = {e.id: e for e in successful}
    failed = {f.id: f for f in result.failed}
    out: list[Outcome] = []
    for i in range(n):
        key = str(i)
        if key in ok:
            out.append((as_result(ok[key]), None))
        elif key in failed:
            out.append((None, error_for(failed[key].code, failed[key].message)))
        else:
            out.append((None, InternalError(f"the batch reply has no entry {key}")))
    return out


def fail_all(batch: Sequence[object], err: BaseException) -> list[Outcome]:
    """A failed batch call fails each of its callers, each with an exception of its own (the
    first caller's is the original)."""
    out: list[Outcome] = [(None, err)]
    for _ in batch[1:]:
        if isinstance(err, QueueError):
            other: BaseException = error_for(err.code, err.message)
        elif isinstance(err, asyncio.CancelledError):
            other = err
        else:  # not an SQS error (a bug, an interrupt): an InternalError that says which
            other = InternalError(f"the batch call failed: {err!r}")
            other.__cause__ = err
        out.append((None, other))
    return out
