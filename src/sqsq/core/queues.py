"""Queue administration: create, delete, set attributes, purge, tags."""

from __future__ import annotations

from sqsq.core import keys, limits, regions
from sqsq.core.attributes import QueueAttributes, parse_queue_attributes, render_queue_attributes
from sqsq.core.commands import (
    CreateQueue,
    DeleteQueue,
    Ok,
    Outcome,
    PurgeQueue,
    QueueCreated,
    SetQueueAttributes,
    TagQueue,
    UntagQueue,
)
from sqsq.core.names import parse_queue_arn, validate_queue_name
from sqsq.core.records import QueueRecord
from sqsq.core.redrivepolicy import redrive_allows
from sqsq.core.state import ShardState
from sqsq.errors import ErrorCode, Rejection, reject


def queue_does_not_exist() -> Rejection:
    return reject(ErrorCode.QUEUE_DOES_NOT_EXIST, "The specified queue does not exist.")


def _check_redrive(st: ShardState, key: str, a: QueueAttributes) -> Rejection | None:
    """The dead-letter target must exist, be here, in the source's account and region (as SQS
    requires), and be of the same type (or be the queue itself, which Amazon accepts)."""
    policy = a.redrive_policy
    if policy is None:
        return None

    def invalid(reason: str) -> Rejection:
        return reject(
            ErrorCode.INVALID_PARAMETER_VALUE,
            f"Value {policy.to_json()} for parameter RedrivePolicy is invalid. Reason: {reason}",
        )

    if parse_queue_arn(policy.dead_letter_target_arn) is None:
        return invalid("Invalid value for deadLetterTargetArn.")
    target = st.config.key_of_arn(policy.dead_letter_target_arn)
    if target is None or st.config.region_of(target) != st.config.region_of(key):
        # Another account's or region's queue is not in this namespace: it does not exist.
        return invalid("Dead-letter target does not exist.")
    if target == key:
        # Amazon accepts a queue as its own dead-letter target; nothing is ever moved.
        return None
    dlq = st.queue(target)
    if dlq is None:
        return invalid("Dead-letter target does not exist.")
    if dlq.attributes.fifo_queue != a.fifo_queue:
        return invalid("Dead-letter queue must be same type of queue as the source.")
    if not redrive_allows(dlq.attributes.redrive_allow_policy, st.config.queue_arn(key)):
        return invalid("The dead-letter target's RedriveAllowPolicy does not allow this "
                       "source queue.")
    return None


def _check_tags(tags: dict[str, str]) -> Rejection | None:
    if len(tags) > limits.QUEUE_TAGS_MAX:
        return reject(ErrorCode.INVALID_PARAMETER_VALUE,
                      f"Too many tags: at most {limits.QUEUE_TAGS_MAX} per queue.")
    for k, v in tags.items():
        if not 1 <= len(k) <= 128 or len(v) > 256:
            return reject(ErrorCode.INVALID_PARAMETER_VALUE,
                          "Tag keys are 1-128 characters and tag values at most 256.")
    return None


def create(st: ShardState, cmd: CreateQueue, now: int) -> Outcome:
    """``cmd.name`` is the queue's key: its name, in a region (see ``sqsq.core.regions``)."""
    region, name = regions.split_key(cmd.name, st.config.region)
    rej = validate_queue_name(name)
    if rej is not None:
        return Outcome(rej)
    if not regions.valid_region(region):
        return Outcome(reject(ErrorCode.INVALID_PARAMETER_VALUE, f"Invalid region {region}."))
    raw = dict(cmd.attributes)
    attrs = parse_queue_attributes(raw, queue_name=name)
    if isinstance(attrs, Rejection):
        return Outcome(attrs)
    existing = st.queue(cmd.name)
    if existing is not None:
        # Idempotent when every attribute the caller named has the value the queue has.
        want, have = render_queue_attributes(attrs), render_queue_attributes(existing.attributes)
        for name in raw:
            if want.get(name) != have.get(name):
                return Outcome(reject(
                    ErrorCode.QUEUE_ALREADY_EXISTS,
                    f"A queue already exists with the same name and a different value for "
                    f"attribute {name}",
                ))
        return Outcome(QueueCreated(cmd.name))
    deleted = st.txn.get(keys.deleted_key(cmd.name))
    if deleted is not None and now - keys.read_u64(deleted) < limits.QUEUE_DELETED_RECENTLY_MS:
        return Outcome(reject(
            ErrorCode.QUEUE_DELETED_RECENTLY,
            "You must wait 60 seconds after deleting a queue before you can create another "
            "with the same name.",
        ))
    tags = dict(cmd.tags)
    rej = _check_redrive(st, cmd.name, attrs) or _check_tags(tags)
    if rej is not None:
        return Outcome(rej)
    q = QueueRecord(st.next_qid(), cmd.name, attrs, now, now, tags)
    st.put_queue(q)
    st.start_counters(q.qid)
    st.txn.delete(keys.deleted_key(cmd.name))
    return Outcome(QueueCreated(cmd.name))


def _retire(st: ShardState, q: QueueRecord) -> None:
    """Hand a queue incarnation's data to the sweep, which deletes it in bounded steps."""
    st.drop_counters(q.qid)
    st.txn.put(keys.garbage_key(q.qid), b"")


def delete_queue(st: ShardState, cmd: DeleteQueue, now: int) -> Outcome:
    q = st.queue(cmd.name)
    if q is None:
        return Outcome(queue_does_not_exist())
    st.txn.delete(keys.queue_key(q.name))
    st.txn.put(keys.deleted_key(q.name), keys.u64(now))
    _retire(st, q)
    return Outcome(Ok())


def set_attributes(st: ShardState, cmd: SetQueueAttributes, now: int) -> Outcome:
    q = st.queue(cmd.name)
    if q is None:
        return Outcome(queue_does_not_exist())
    attrs = parse_queue_attributes(dict(cmd.attributes), queue_name=regions.name_of(q.name),
                                   base=q.attributes)
    if isinstance(attrs, Rejection):
        return Outcome(attrs)
    rej = _check_redrive(st, q.name, attrs)
    if rej is not None:
        return Outcome(rej)
    q.attributes, q.modified_ms = attrs, now
    st.put_queue(q)
    return Outcome(Ok())


def purge(st: ShardState, cmd: PurgeQueue, now: int) -> Outcome:
    q = st.queue(cmd.name)
    if q is None:
        return Outcome(queue_does_not_exist())
    if q.last_purge_ms is not None and now - q.last_purge_ms < limits.PURGE_IN_PROGRESS_MS:
        return Outcome(reject(
            ErrorCode.PURGE_QUEUE_IN_PROGRESS,
            f"Only one PurgeQueue operation on {regions.name_of(q.name)} is allowed every 60 "
            "seconds.",
        ))
    # A new incarnation: messages and groups of the old one are gone for readers at once and
    # deleted by the sweep. FIFO deduplication ids go with them, as Amazon was recorded doing
    # (they are keyed by the incarnation; the old ones leave through their expiry index).
    # Client request ids stay under the first incarnation: a retried send stays one message.
    _retire(st, q)
    q.dedup_qid = q.dedup_scope_qid
    q.qid, q.last_purge_ms = st.next_qid(), now
    st.start_counters(q.qid)
    st.put_queue(q)
    return Outcome(Ok())


def tag(st: ShardState, cmd: TagQueue, now: int) -> Outcome:
    q = st.queue(cmd.name)
    if q is None:
        return Outcome(queue_does_not_exist())
    tags = {**q.tags, **dict(cmd.tags)}
    rej = _check_tags(tags)
    if rej is not None:
        return Outcome(rej)
    q.tags = tags
    st.put_queue(q)
    return Outcome(Ok())


def untag(st: ShardState, cmd: UntagQueue, now: int) -> Outcome:
    q = st.queue(cmd.name)
    if q is None:
        return Outcome(queue_does_not_exist())
    for k in cmd.tag_keys:
        q.tags.pop(k, None)
    st.put_queue(q)
    return Outcome(Ok())
