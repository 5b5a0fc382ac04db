"""Errors, in one place for the server and the SDK: the one error table (``ErrorCode``), the
values the core returns for expected failures (``Rejection``), and the exceptions users
catch (``QueueError`` and one subclass per SQS error code).

Every error sqsq can report is an ``ErrorCode``: its SQS error code (what boto3 shows as
``Error.Code``), the legacy query-protocol code (sent in ``x-amzn-query-error``), its HTTP
status, its gRPC status name (a string: the core does not import grpc), whether the caller
is at fault (``Sender``) and whether a retry may help. The core returns expected failures as
values, never raised; the edges and the SDK raise them as exceptions:

    try:
        client.get_queue_url("nope")
    except QueueDoesNotExist as e:      # or: except QueueError as e: e.code == "QueueDoesNotExist"
        ...

The exception classes are generated from the table, so a code cannot exist on the wire
without its exception here. Pure (no I/O): the delivery core imports it, and so does the SDK,
which imports no server code.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class ErrorSpec:
    sqs_code: str
    query_code: str
    http_status: int
    grpc_status: str
    sender_fault: bool = True
    retryable: bool = False


class ErrorCode(Enum):
    QUEUE_DOES_NOT_EXIST = ErrorSpec(
        "QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", 400, "NOT_FOUND"
    )
    QUEUE_ALREADY_EXISTS = ErrorSpec(
        "QueueAlreadyExists", "QueueAlreadyExists", 400, "ALREADY_EXISTS"
    )
    QUEUE_DELETED_RECENTLY = ErrorSpec(
        "QueueDeletedRecently",
        "AWS.SimpleQueueService.QueueDeletedRecently",
        400,
        "FAILED_PRECONDITION",
    )
    PURGE_QUEUE_IN_PROGRESS = ErrorSpec(
        "PurgeQueueInProgress",
        "AWS.SimpleQueueService.PurgeQueueInProgress",
        403,
        "FAILED_PRECONDITION",
    )
    INVALID_PARAMETER_VALUE = ErrorSpec(
        "InvalidParameterValue", "InvalidParameterValue", 400, "INVALID_ARGUMENT"
    )
    INVALID_ATTRIBUTE_NAME = ErrorSpec(
        "InvalidAttributeName", "InvalidAttributeName", 400, "INVALID_ARGUMENT"
    )
    INVALID_ATTRIBUTE_VALUE = ErrorSpec(
        "InvalidAttributeValue", "InvalidAttributeValue", 400, "INVALID_ARGUMENT"
    )
    INVALID_MESSAGE_CONTENTS = ErrorSpec(
        "InvalidMessageContents", "InvalidMessageContents", 400, "INVALID_ARGUMENT"
    )
    MISSING_PARAMETER = ErrorSpec(
        "MissingParameter", "MissingParameter", 400, "INVALID_ARGUMENT"
    )
    RECEIPT_HANDLE_IS_INVALID = ErrorSpec(
        "ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", 404, "INVALID_ARGUMENT"
    )
    MESSAGE_NOT_INFLIGHT = ErrorSpec(
        "MessageNotInflight",
        "AWS.SimpleQueueService.MessageNotInflight",
        400,
        "FAILED_PRECONDITION",
    )
    TOO_MANY_ENTRIES_IN_BATCH_REQUEST = ErrorSpec(
        "TooManyEntriesInBatchRequest",
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        400,
        "INVALID_ARGUMENT",
    )
    BATCH_ENTRY_IDS_NOT_DISTINCT = ErrorSpec(
        "BatchEntryIdsNotDistinct",
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        400,
        "INVALID_ARGUMENT",
    )
    EMPTY_BATCH_REQUEST = ErrorSpec(
        "EmptyBatchRequest",
        "AWS.SimpleQueueService.EmptyBatchRequest",
        400,
        "INVALID_ARGUMENT",
    )
    INVALID_BATCH_ENTRY_ID = ErrorSpec(
        "InvalidBatchEntryId",
        "AWS.SimpleQueueService.InvalidBatchEntryId",
        400,
        "INVALID_ARGUMENT",
    )
    BATCH_REQUEST_TOO_LONG = ErrorSpec(
        "BatchRequestTooLong",
        "AWS.SimpleQueueService.BatchRequestTooLong",
        400,
        "INVALID_ARGUMENT",
    )
    UNSUPPORTED_OPERATION = ErrorSpec(
        "UnsupportedOperation",
        "AWS.SimpleQueueService.UnsupportedOperation",
        400,
        "FAILED_PRECONDITION",
    )
    OVER_LIMIT = ErrorSpec("OverLimit", "OverLimit", 403, "RESOURCE_EXHAUSTED")
    RESOURCE_NOT_FOUND = ErrorSpec(
        "ResourceNotFoundException", "ResourceNotFoundException", 404, "NOT_FOUND"
    )
    ACCESS_DENIED = ErrorSpec("AccessDenied", "AccessDenied", 403, "PERMISSION_DENIED")
    MISSING_AUTHENTICATION_TOKEN = ErrorSpec(
        "MissingAuthenticationToken", "MissingAuthenticationToken", 403, "UNAUTHENTICATED"
    )
    INVALID_CLIENT_TOKEN_ID = ErrorSpec(
        "InvalidClientTokenId", "InvalidClientTokenId", 403, "UNAUTHENTICATED"
    )
    SIGNATURE_DOES_NOT_MATCH = ErrorSpec(
        "SignatureDoesNotMatch", "SignatureDoesNotMatch", 403, "UNAUTHENTICATED"
    )
    INVALID_ACTION = ErrorSpec("InvalidAction", "InvalidAction", 400, "UNIMPLEMENTED")
    SERVICE_UNAVAILABLE = ErrorSpec(
        "ServiceUnavailable",
        "ServiceUnavailable",
        503,
        "UNAVAILABLE",
        sender_fault=False,
        retryable=True,
    )
    # Internal, between the gateway and a shard replica that does not lead: never appended,
    # so always safe to retry at the leader named in the message (see sqsq.errors).
    NOT_LEADER = ErrorSpec(
        "NotLeader", "NotLeader", 503, "UNAVAILABLE", sender_fault=False, retryable=True
    )
    INTERNAL_ERROR = ErrorSpec(
        "InternalError", "InternalError", 500, "INTERNAL", sender_fault=False
    )

    @property
    def sqs_code(self) -> str:
        return self.value.sqs_code

    @property
    def spec(self) -> ErrorSpec:
        return self.value


BY_SQS_CODE: dict[str, ErrorCode] = {c.sqs_code: c for c in ErrorCode}


@dataclass(frozen=True)
class Rejection:
    """An expected failure, returned as a value: the code and a message for humans."""

    code: ErrorCode
    message: str

    @property
    def sqs_code(self) -> str:
        return self.code.sqs_code


def reject(code: ErrorCode, message: str) -> Rejection:
    return Rejection(code, message)


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
