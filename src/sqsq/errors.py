"""The exceptions users catch: ``QueueError`` and one subclass per SQS error code.

    try:
        client.get_queue_url("nope")
    except QueueDoesNotExist as e:      # or: except QueueError as e: e.code == "QueueDoesNotExist"
        ...

The classes are generated from the one error table (``sqsq.core.errors.ErrorCode``), so a
code cannot exist on the wire without its exception here.
"""

from __future__ import annotations

from sqsq.core.errors import BY_SQS_CODE, ErrorCode, Rejection


class QueueError(Exception):
    """An SQS error: ``code`` is SQS's error code (``QueueDoesNotExist``, ...)."""

    error_code: ErrorCode = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str = "", code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.error_code.sqs_code

    @property
    def http_status(self) -> int:
        return self.error_code.spec.http_status

    @property
    def sender_fault(self) -> bool:
        return self.error_code.spec.sender_fault

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


_CLASSES: dict[str, type[QueueError]] = {}
for _code in ErrorCode:
    _cls = type(_code.sqs_code, (QueueError,), {"error_code": _code, "__module__": __name__})
    _CLASSES[_code.sqs_code] = _cls
    globals()[_code.sqs_code] = _cls

# Names for linters and readers; each is a QueueError subclass from the table.
QueueDoesNotExist = _CLASSES["QueueDoesNotExist"]
QueueAlreadyExists = _CLASSES["QueueAlreadyExists"]
QueueDeletedRecently = _CLASSES["QueueDeletedRecently"]
PurgeQueueInProgress = _CLASSES["PurgeQueueInProgress"]
InvalidParameterValue = _CLASSES["InvalidParameterValue"]
InvalidAttributeName = _CLASSES["InvalidAttributeName"]
InvalidAttributeValue = _CLASSES["InvalidAttributeValue"]
InvalidMessageContents = _CLASSES["InvalidMessageContents"]
MissingParameter = _CLASSES["MissingParameter"]
ReceiptHandleIsInvalid = _CLASSES["ReceiptHandleIsInvalid"]
MessageNotInflight = _CLASSES["MessageNotInflight"]
TooManyEntriesInBatchRequest = _CLASSES["TooManyEntriesInBatchRequest"]
BatchEntryIdsNotDistinct = _CLASSES["BatchEntryIdsNotDistinct"]
EmptyBatchRequest = _CLASSES["EmptyBatchRequest"]
InvalidBatchEntryId = _CLASSES["InvalidBatchEntryId"]
BatchRequestTooLong = _CLASSES["BatchRequestTooLong"]
ServiceUnavailable = _CLASSES["ServiceUnavailable"]
NotLeader = _CLASSES["NotLeader"]
InternalError = _CLASSES["InternalError"]


def error_for(code: str, message: str) -> QueueError:
    """The exception for an SQS error code (unknown codes become a plain QueueError)."""
    cls = _CLASSES.get(code)
    if cls is None:
        return QueueError(message, code)
    return cls(message)


def from_rejection(rejection: Rejection) -> QueueError:
    return _CLASSES[rejection.code.sqs_code](rejection.message)


def code_of(sqs_code: str) -> ErrorCode:
    return BY_SQS_CODE.get(sqs_code, ErrorCode.INTERNAL_ERROR)


_LEADER_IS = "leader="


def not_leader_message(leader: str | None) -> str:
    """NotLeader's message, carrying the leader's address when the replica knows it."""
    return f"This replica does not lead its shard; {_LEADER_IS}{leader or ''}"


def leader_of(error: QueueError) -> str | None:
    """The leader address a NotLeader error names, if any."""
    _, sep, leader = error.message.rpartition(_LEADER_IS)
    return leader.strip() or None if sep else None
