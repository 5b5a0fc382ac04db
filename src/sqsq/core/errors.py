"""The one table of domain outcomes that are failures.

Every error sqsq can report is an ``ErrorCode``: its SQS error code (what boto3 shows as
``Error.Code``), the legacy query-protocol code (sent in ``x-amzn-query-error``), its HTTP
status, its gRPC status name (a string: the core does not import grpc), whether the caller
is at fault (``Sender``) and whether a retry may help.

Expected failures are values (``Rejection``), returned by the core, never raised.
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
