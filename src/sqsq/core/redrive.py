"""Message move tasks: move messages out of a dead-letter queue, at a bounded rate.

A task is state in the shard; the moving is time-driven work done by Sweep, so it is logged
and replicated like everything else and never runs faster than its rate. A moved message
keeps its MessageId, body and attributes; it starts over in the destination with a receive
count of 0 and without DeadLetterQueueSourceArn.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
from dataclasses import dataclass

from sqsq.core import keys
from sqsq.core import records as r
from sqsq.core.commands import Outcome
from sqsq.core.delivery import enqueue, promote_due, remove
from sqsq.core.records import VISIBLE, QueueRecord, pack, unpack
from sqsq.core.state import ShardState
from sqsq.core.txn import prefix_end
from sqsq.errors import ErrorCode, Rejection, reject

RUNNING, COMPLETED, CANCELLED, FAILED = "RUNNING", "COMPLETED", "CANCELLED", "FAILED"
DEFAULT_RATE = 500  # messages per second when the caller names none ("system optimized")
MAX_RATE = 500
TASKS_KEPT_PER_SOURCE = 10


@dataclass(frozen=True)
class StartMoveTask:
    source_arn: str
    destination_arn: str | None = None
    max_number_of_messages_per_second: int | None = None
    task_handle: str = ""  # stamped by the leader (or given by a gateway, the same for all
    #                        partitions of a queue)


@dataclass(frozen=True)
class CancelMoveTask:
    task_handle: str


@dataclass(frozen=True)
class MoveTaskStarted:
    task_handle: str


@dataclass(frozen=True)
class MoveTaskCancelled:
    approximate_number_of_messages_moved: int


@dataclass
class MoveTask:
    handle: str
    source: str
    destination: str | None
    rate: int | None
    status: str
    moved: int
    to_move: int
    started_ms: int
    last_ms: int
    failure_reason: str | None = None

    def encode(self) -> bytes:
        return pack([self.handle, self.source, self.destination, self.rate, self.status,
                     self.moved, self.to_move, self.started_ms, self.last_ms,
                     self.failure_reason])

    @classmethod
    def decode(cls, raw: bytes) -> MoveTask:
        return cls(*unpack(raw))

    def key(self) -> bytes:
        return task_key(self.source, self.started_ms, self.handle)


def task_key(source: str, started_ms: int, handle: str) -> bytes:
    return b"t" + source.encode() + b"\x00" + keys.u64(started_ms) + handle.encode()


def handle_key(handle: str) -> bytes:
    return b"h" + handle.encode()


def _not_found(what: str) -> Rejection:
    return reject(ErrorCode.RESOURCE_NOT_FOUND, f"The resource that you specified for the "
                  f"{what} parameter doesn't exist.")


def make_task_handle(stamp: str, source_arn: str) -> str:
    """Amazon's handle shape: base64 of ``{"taskId": "<uuid>", "sourceArn": "<ARN>"}``.

    The task id is drawn from the leader's random ``stamp`` (a hash, so any stamp works), so
    every replica derives the same handle.
    """
    h = hashlib.sha256(stamp.encode()).hexdigest()
    task_id = f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"
    doc = json.dumps({"taskId": task_id, "sourceArn": source_arn}, separators=(",", ":"))
    return base64.b64encode(doc.encode()).decode()


def parse_task_handle(handle: str) -> tuple[str, str] | None:
    """(taskId, sourceArn) of a handle that decodes as Amazon's do, else None."""
    try:
        doc = json.loads(base64.b64decode(handle, validate=True))
    except (binascii.Error, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    task_id, arn = doc.get("taskId"), doc.get("sourceArn")
    if not isinstance(task_id, str) or not isinstance(arn, str) or not task_id:
        return None
    return task_id, arn


def _queue_for_arn(st: ShardState, arn: str) -> QueueRecord | None:
    key = st.config.key_of_arn(arn)
    return None if key is None else st.queue(key)


def tasks_of(st: ShardState, source: str) -> list[MoveTask]:
    """A source queue's tasks, newest first."""
    prefix = b"t" + source.encode() + b"\x00"
    return [MoveTask.decode(v) for _, v in st.txn.scan(prefix, prefix_end(prefix),
                                                       reverse=True)]


def start(st: ShardState, cmd: StartMoveTask, now: int) -> Outcome:
    src = _queue_for_arn(st, cmd.source_arn)
    if src is None:
        return Outcome(_not_found("SourceArn"))
    arn = st.config.queue_arn(src.name)
    if not any(q.attributes.redrive_policy
               and q.attributes.redrive_policy.dead_letter_target_arn == arn
               for q in st.queues()):
        return Outcome(reject(ErrorCode.INVALID_PARAMETER_VALUE,
                              "Source queue must be configured as a Dead Letter Queue."))
    dest = None
    if cmd.destination_arn:
        dq = _queue_for_arn(st, cmd.destination_arn)
        # Messages move within their region, as redrive does: another region's is not here.
        if dq is None or st.config.region_of(dq.name) != st.config.region_of(src.name):
            return Outcome(_not_found("DestinationArn"))
        if dq.attributes.fifo_queue != src.attributes.fifo_queue or dq.name == src.name:
            return Outcome(reject(ErrorCode.INVALID_PARAMETER_VALUE,
                                  "Destination queue must be another queue of the same type."))
        dest = dq.name
    rate = cmd.max_number_of_messages_per_second
    if rate is not None and not 1 <= rate <= MAX_RATE:
        return Outcome(reject(ErrorCode.INVALID_PARAMETER_VALUE,
                              f"MaxNumberOfMessagesPerSecond must be between 1 and {MAX_RATE}."))
    previous = tasks_of(st, src.name)
    if any(t.status == RUNNING for t in previous):
        return Outcome(reject(ErrorCode.INVALID_PARAMETER_VALUE,
                              "There is already a task running. Only one active task is "
                              "allowed for a source queue arn at a given time."))
    for old in previous[TASKS_KEPT_PER_SOURCE - 1:]:
        st.txn.delete(old.key())
        st.txn.delete(handle_key(old.handle))
    promote_due(st, src, now, 2_000)
    task = MoveTask(make_task_handle(cmd.task_handle, arn), src.name, dest, rate, RUNNING, 0,
                    st.counters(src.qid).visible, now, now)
    st.txn.put(task.key(), task.encode())
    st.txn.put(handle_key(task.handle), task.key())
    return Outcome(MoveTaskStarted(task.handle))


def cancel(st: ShardState, cmd: CancelMoveTask, now: int) -> Outcome:
    parsed = parse_task_handle(cmd.task_handle)
    if parsed is None:
        return Outcome(reject(ErrorCode.INVALID_PARAMETER_VALUE,
                              "Value for parameter TaskHandle is invalid."))
    if _queue_for_arn(st, parsed[1]) is None:
        return Outcome(_not_found("SourceArn"))
    key = st.txn.get(handle_key(cmd.task_handle))
    raw = st.txn.get(key) if key else None
    task = MoveTask.decode(raw) if raw else None
    if task is None or task.status != RUNNING:
        return Outcome(reject(ErrorCode.RESOURCE_NOT_FOUND, "Task does not exist."))
    task.status, task.last_ms = CANCELLED, now
    st.txn.put(task.key(), task.encode())
    return Outcome(MoveTaskCancelled(task.moved))


def running(st: ShardState) -> list[MoveTask]:
    return [t for _, v in st.scan_prefix(b"t") if (t := MoveTask.decode(v)).status == RUNNING]


def advance(st: ShardState, task: MoveTask, now: int, budget: int) -> tuple[int, set[str]]:
    """Move what the task's rate allows since it last ran; returns (work done, woken queues)."""
    rate = task.rate or DEFAULT_RATE
    allowed = min((now - task.last_ms) * rate // 1000, task.to_move - task.moved, budget)
    src = st.queue(task.source)
    woken: set[str] = set()
    if src is None:
        return _finish(st, task, now, FAILED, "The source queue no longer exists."), woken
    if allowed <= 0 and task.moved < task.to_move:
        return 0, woken
    done = 0
    while done < allowed:
        item = _next_visible(st, src)
        if item is None:
            break
        seq, d = item
        m = st.message(src.qid, seq)
        assert m is not None, "a visible message without its record"
        if task.destination:  # a chosen destination that is gone fails the task
            target = st.queue(task.destination)
        else:
            target = _queue_for_arn(st, m.dead_letter_source_arn or "")
        if target is None:
            return done + _finish(st, task, now, FAILED,
                                  "The destination queue of a message does not exist."), woken
        remove(st, src, seq, d, now)
        moved = dataclasses.replace(m, dead_letter_source_arn=None, dead_lettered_ms=None)
        enqueue(st, target, moved, visible_at=now, now=now)
        woken.add(target.name)
        done += 1
    task.moved += done
    # Time not spent moving is not banked: the rate holds over any window.
    task.last_ms = now if done == allowed else task.last_ms + done * 1000 // rate
    if task.moved >= task.to_move or (done < allowed and _next_visible(st, src) is None):
        return done + _finish(st, task, now, COMPLETED, None), woken
    st.txn.put(task.key(), task.encode())
    return max(done, 1), woken


def _finish(st: ShardState, task: MoveTask, now: int, status: str, reason: str | None) -> int:
    task.status, task.failure_reason, task.last_ms = status, reason, now
    st.txn.put(task.key(), task.encode())
    return 1


def _next_visible(st: ShardState, q: QueueRecord) -> tuple[int, r.Delivery] | None:
    """The oldest visible message (for FIFO queues: the head of any receivable group)."""
    for key, _ in st.scan_index("k" if q.attributes.fifo_queue else "v", q.qid):
        # FIFO: the ready index holds (since, head seq, group); standard: (visible_at, seq).
        seq = keys.ready_group_of(key)[0] if q.attributes.fifo_queue else keys.seq_of(key)
        d = st.delivery(q.qid, seq)
        if d is not None and d.state == VISIBLE:
            return seq, d
    return None


def describe(task: MoveTask, arn_of) -> dict:  # noqa: ANN001 - arn_of: name -> ARN
    """A task as ListMessageMoveTasks reports it."""
    out: dict = {
        "Status": task.status,
        "SourceArn": arn_of(task.source),
        "ApproximateNumberOfMessagesMoved": task.moved,
        "ApproximateNumberOfMessagesToMove": task.to_move,
        "StartedTimestamp": task.started_ms,
    }
    if task.status == RUNNING:
        out["TaskHandle"] = task.handle
    if task.destination:
        out["DestinationArn"] = arn_of(task.destination)
    if task.rate:
        out["MaxNumberOfMessagesPerSecond"] = task.rate
    if task.failure_reason:
        out["FailureReason"] = task.failure_reason
    return out

