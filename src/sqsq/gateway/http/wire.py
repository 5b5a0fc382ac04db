"""What both wire protocols share: decoded request parameters and errors as SQS sends them.

Handlers see parameters in the JSON protocol's shape (``QueueUrl``, ``Entries``,
``MessageAttributes``...); the query protocol decodes its form into that same shape.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from sqsq.api import Endpoint
from sqsq.errors import ErrorCode, QueueError, error_for

# The JSON protocol's __type names the error shape, which for a few codes is not the code
# itself (as Amazon SQS answers, recorded).
_SHAPE_NAMES = {
    "QueueAlreadyExists": "QueueNameExists",
    "InvalidParameterValue": "InvalidParameterValueException",
    "MissingParameter": "MissingRequiredParameterException",
}


@dataclass
class WireError(Exception):
    """An error as it goes on the wire; raised by the protocol layer, rendered per protocol."""

    code: str  # SQS's error code, e.g. QueueDoesNotExist
    query_code: str  # the query protocol's code, e.g. AWS.SimpleQueueService.NonExistentQueue
    status: int
    message: str
    sender_fault: bool = True

    @property
    def shape(self) -> str:
        return _SHAPE_NAMES.get(self.code, self.code)

    @property
    def fault(self) -> str:
        return "Sender" if self.sender_fault else "Receiver"

    @classmethod
    def of(cls, error: QueueError) -> WireError:
        spec = error.error_code.spec
        query_code = spec.query_code if error.code == spec.sqs_code else error.code
        return cls(error.code, query_code, error.http_status, error.message, spec.sender_fault)


def invalid(message: str, code: ErrorCode = ErrorCode.INVALID_PARAMETER_VALUE) -> QueueError:
    return error_for(code.sqs_code, message)


def missing(name: str) -> QueueError:
    return invalid(f"The request must contain the parameter {name}.", ErrorCode.MISSING_PARAMETER)


class Params:
    """One request's parameters (or one batch entry's), with SQS's checks on reading; the
    queue they address as its key, in the caller's ``region`` (None: the configured one)."""

    def __init__(self, data: dict[str, Any], path_queue_url: str | None = None,
                 endpoint: Endpoint | None = None, region: str | None = None) -> None:
        self.data = data
        self.path_queue_url = path_queue_url  # older SDKs address the queue by the URL path
        self.endpoint = endpoint or Endpoint()
        self.region = region

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def text(self, name: str, required: bool = False) -> str | None:
        value = self.data.get(name)
        if value is None or (required and value == ""):
            if required:
                raise missing(name)
            return None
        if not isinstance(value, str):
            raise invalid(f"Value for parameter {name} is invalid. Reason: must be a string.")
        return value

    def required(self, name: str) -> str:
        value = self.text(name, required=True)
        assert value is not None
        return value

    def queue(self) -> str:
        """The key of the queue QueueUrl (else the URL posted to) names."""
        url = self.text("QueueUrl") or self.path_queue_url
        if not url:
            raise missing("QueueUrl")
        return self.endpoint.queue_key(url, self.region)

    def queue_named(self) -> str:
        """The key of the queue QueueName names."""
        return self.endpoint.named_key(self.required("QueueName"), self.region)

    def queue_prefix(self) -> str:
        """ListQueues' QueueNamePrefix, as a prefix of keys in the caller's region."""
        return self.endpoint.named_key(self.text("QueueNamePrefix") or "", self.region)

    def integer(self, name: str, required: bool = False) -> int | None:
        value = self.data.get(name)
        if value is None or value == "":
            if required:
                raise missing(name)
            return None
        if isinstance(value, bool):
            raise invalid(f"Value {value} for parameter {name} is invalid. Reason: not a number.")
        if isinstance(value, int):
            return value
        try:
            return int(str(value).strip())
        except ValueError:
            raise invalid(f"Value {value} for parameter {name} is invalid. "
                          "Reason: must be an integer.") from None

    def strings(self, name: str) -> list[str]:
        value = self.data.get(name) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise invalid(f"Value for parameter {name} is invalid. Reason: must be a list.")
        return value

    def mapping(self, name: str) -> dict[str, Any]:
        value = self.data.get(name) or {}
        if not isinstance(value, dict):
            raise invalid(f"Value for parameter {name} is invalid. Reason: must be a map.")
        return value

    def entries(self, name: str = "Entries") -> list[Params]:
        value = self.data.get(name) or []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise invalid(f"Value for parameter {name} is invalid. Reason: must be a list.")
        return [Params(v) for v in value]


def b64decode(name: str, value: Any) -> bytes:
    """Blobs travel base64-encoded in both protocols."""
    if not isinstance(value, str):
        raise invalid(f"Value for parameter {name} is invalid. Reason: must be base64.")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"Value for parameter {name} is invalid. Reason: not base64.") from None
