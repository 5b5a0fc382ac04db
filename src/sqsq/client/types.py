"""The results the SDK returns: frozen dataclasses named after SQS's response shapes (built
through ``quick_init``'s quicker ``__init__``: a client makes one or more per message)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqsq.frozen import quick_init

# boto3's shape of one message attribute: {"DataType": "String", "StringValue": "x"}
# or {"DataType": "Binary", "BinaryValue": b"..."}.
MessageAttributes = dict[str, dict[str, Any]]


@quick_init
@dataclass(frozen=True)
class SendResult:
    """The outcome of ``send_message``."""

    message_id: str
    md5_of_message_body: str
    md5_of_message_attributes: str | None = None
    sequence_number: str | None = None
    md5_of_message_system_attributes: str | None = None


@quick_init
@dataclass(frozen=True)
class SendBatchResultEntry:
    """One sent entry of ``send_message_batch``: the entry ``id`` plus the send result."""

    id: str
    message_id: str
    md5_of_message_body: str
    md5_of_message_attributes: str | None = None
    sequence_number: str | None = None
    md5_of_message_system_attributes: str | None = None


@quick_init
@dataclass(frozen=True)
class BatchResultEntry:
    """One successful entry of ``delete_message_batch`` / ``change_message_visibility_batch``."""

    id: str


@quick_init
@dataclass(frozen=True)
class BatchError:
    """One failed batch entry, as SQS reports it (``code`` is the SQS error code)."""

    id: str
    code: str
    message: str
    sender_fault: bool


@quick_init
@dataclass(frozen=True)
class BatchResult:
    """The outcome of a batch action: per-entry successes and failures."""

    successful: list[Any] = field(default_factory=list)
    failed: list[BatchError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no entry failed."""
        return not self.failed


@quick_init
@dataclass(frozen=True)
class Message:
    """A received message."""

    message_id: str
    receipt_handle: str
    body: str
    md5_of_body: str
    md5_of_message_attributes: str | None = None
    attributes: dict[str, str] = field(default_factory=dict)
    message_attributes: MessageAttributes = field(default_factory=dict)

    @property
    def receive_count(self) -> int | None:
        """``ApproximateReceiveCount`` when it was requested, else None."""
        value = self.attributes.get("ApproximateReceiveCount")
        return int(value) if value is not None else None
