"""The closed set of commands the shard state machine applies, and what they return.

Commands are what a leader proposes to the log; every value that is not a pure function of
the state (the time, message ids, receipt nonces) is stamped into the entry by the leader
before it is proposed, so every replica that applies the same entry reaches the same state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqsq.core.messages import MessageAttributeValue
from sqsq.errors import Rejection
from sqsq.frozen import quick_init

Pairs = tuple[tuple[str, str], ...]
MessageAttributes = tuple[tuple[str, MessageAttributeValue], ...]


# ---- queue administration -------------------------------------------------------------


@dataclass(frozen=True)
class CreateQueue:
    name: str
    attributes: Pairs = ()
    tags: Pairs = ()


@dataclass(frozen=True)
class DeleteQueue:
    name: str


@dataclass(frozen=True)
class SetQueueAttributes:
    name: str
    attributes: Pairs


@dataclass(frozen=True)
class PurgeQueue:
    name: str


@dataclass(frozen=True)
class TagQueue:
    name: str
    tags: Pairs


@dataclass(frozen=True)
class UntagQueue:
    name: str
    tag_keys: tuple[str, ...]


# ---- delivery ---------------------------------------------------------------------------


@quick_init
@dataclass(frozen=True)
class SendEntry:
    entry_id: str
    body: str
    delay_seconds: int | None = None
    message_attributes: MessageAttributes = ()
    message_group_id: str | None = None
    message_deduplication_id: str | None = None
    aws_trace_header: str | None = None  # the one message system attribute SQS takes


@quick_init
@dataclass(frozen=True)
class SendMessages:
    """SendMessage is a batch of one. ``message_ids`` is stamped by the leader, one per entry.

    ``request_id`` is the client's idempotency key: a retried send with the same request id
    (and entry id) within the deduplication window returns the first result.
    """

    queue: str
    entries: tuple[SendEntry, ...]
    request_id: str = ""
    message_ids: tuple[str, ...] = ()


@quick_init
@dataclass(frozen=True)
class ReceiveMessages:
    queue: str
    max_number_of_messages: int = 1
    visibility_timeout_s: int | None = None
    nonce: int = 0  # stamped by the leader; makes each handle unguessable
    receive_request_attempt_id: str = ""  # FIFO: a retry within 5 minutes gets the same answer


@quick_init
@dataclass(frozen=True)
class DeleteMessages:
    queue: str
    entries: tuple[tuple[str, str], ...]  # (entry id, receipt handle)


@quick_init
@dataclass(frozen=True)
class ChangeVisibilities:
    queue: str
    entries: tuple[tuple[str, str, int], ...]  # (entry id, receipt handle, timeout s)


@dataclass(frozen=True)
class Sweep:
    """Time-driven work as a logged command: timers, retention, dedup windows, garbage."""


@dataclass(frozen=True)
class Configure:
    """Record the cluster configuration's fingerprint (receipt-handle secret, region,
    account) in the replicated state, once: every replica checks it against its own."""

    fingerprint: str


Command = (
    CreateQueue
    | DeleteQueue
    | SetQueueAttributes
    | PurgeQueue
    | TagQueue
    | UntagQueue
    | SendMessages
    | ReceiveMessages
    | DeleteMessages
    | ChangeVisibilities
    | Sweep
    | Configure
)


# ---- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ok:
    pass


@dataclass(frozen=True)
class QueueCreated:
    name: str


@quick_init
@dataclass(frozen=True)
class SentMessage:
    entry_id: str
    message_id: str
    md5_of_message_body: str
    md5_of_message_attributes: str | None
    sequence_number: str | None
    md5_of_message_system_attributes: str | None = None


@quick_init
@dataclass(frozen=True)
class EntryFailed:
    entry_id: str
    rejection: Rejection


@quick_init
@dataclass(frozen=True)
class BatchResult:
    successful: tuple = ()  # SentMessage for sends, entry ids (str) otherwise
    failed: tuple[EntryFailed, ...] = ()


@quick_init
@dataclass(frozen=True)
class ReceivedMessage:
    message_id: str
    receipt_handle: str
    body: str
    md5_of_body: str
    md5_of_message_attributes: str | None
    message_attributes: MessageAttributes
    attributes: Pairs  # every system attribute; the edge filters by AttributeNames


@quick_init
@dataclass(frozen=True)
class Received:
    messages: tuple[ReceivedMessage, ...]


@dataclass(frozen=True)
class Swept:
    more: bool  # the work bound was hit: sweep again soon


Result = Ok | QueueCreated | BatchResult | Received | Swept | Rejection


# ---- effects: run by the leader only, after the entry is durable ------------------------


@quick_init
@dataclass(frozen=True)
class WakeReceivers:
    """Messages became visible in this queue: long polls waiting on it should try again."""

    queue: str


@quick_init
@dataclass(frozen=True)
class Outcome:
    result: Result
    effects: tuple[WakeReceivers, ...] = field(default=())
