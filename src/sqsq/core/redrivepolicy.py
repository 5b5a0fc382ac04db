"""Redrive policies: where a queue's failed messages go (RedrivePolicy) and which source
queues may send theirs to a dead-letter queue (RedriveAllowPolicy), parsed as SQS does.

Pure: no I/O, no clock. Failures are returned as ``Rejection`` values.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from sqsq.core import limits
from sqsq.core.names import parse_queue_arn
from sqsq.errors import ErrorCode, Rejection, reject

_REDRIVE_ALLOW_SOURCE_ARNS_MAX = 10
# An integer as SQS reads one in an attribute value (re.ASCII: no non-ASCII digits).
INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)


@dataclass(frozen=True)
class RedrivePolicy:
    dead_letter_target_arn: str
    max_receive_count: int

    def to_json(self) -> str:
        # SQS renders the count as a JSON number, keys in this order, no spaces.
        return json.dumps(
            {
                "deadLetterTargetArn": self.dead_letter_target_arn,
                "maxReceiveCount": self.max_receive_count,
            },
            separators=(",", ":"),
        )


def _invalid_parameter(name: str, value: str, reason: str) -> Rejection:
    # SQS's wording for policies that parse but make no sense.
    return reject(
        ErrorCode.INVALID_PARAMETER_VALUE,
        f"Value {value} for parameter {name} is invalid. Reason: {reason}",
    )


def _json_object(name: str, value: str, what: str) -> dict[str, Any] | Rejection:
    """A policy's JSON object, or SQS's answer to one that is not."""
    try:
        doc: Any = json.loads(value)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return _invalid_parameter(name, value, f"{what} is not a dict or valid json.")
    return doc


def parse_redrive_policy(value: str) -> RedrivePolicy | None | Rejection:
    if value == "":
        return None  # "" removes the policy
    name = "RedrivePolicy"
    doc = _json_object(name, value, "Redrive policy")
    if isinstance(doc, Rejection):
        return doc
    for key in ("deadLetterTargetArn", "maxReceiveCount"):
        if key not in doc:
            return _invalid_parameter(
                name, value, f"Redrive policy does not contain mandatory attribute: {key}."
            )
    arn = doc["deadLetterTargetArn"]
    if not isinstance(arn, str) or parse_queue_arn(arn) is None:
        return _invalid_parameter(name, value, f"Invalid value for deadLetterTargetArn: {arn}.")
    raw_count = doc["maxReceiveCount"]
    count: int | None = None
    # bool is an int subclass in Python; JSON true is not a count.
    if isinstance(raw_count, int) and not isinstance(raw_count, bool):
        count = raw_count
    elif isinstance(raw_count, str) and INT_RE.fullmatch(raw_count):
        count = int(raw_count)
    lo, hi = limits.MAX_RECEIVE_COUNT
    if count is None or not lo <= count <= hi:
        return _invalid_parameter(
            name,
            value,
            f"Invalid value for maxReceiveCount: {raw_count}, valid values are from "
            f"{lo} to {hi} both inclusive.",
        )
    return RedrivePolicy(arn, count)


def redrive_allows(allow_policy: str | None, source_arn: str) -> bool:
    """Whether a dead-letter queue's RedriveAllowPolicy lets ``source_arn`` name it."""
    if allow_policy is None:
        return True
    doc = json.loads(allow_policy)  # stored only after parse_redrive_allow_policy checked it
    permission = doc["redrivePermission"]
    if permission == "byQueue":
        return source_arn in doc["sourceQueueArns"]
    return permission == "allowAll"


def parse_redrive_allow_policy(value: str) -> str | None | Rejection:
    if value == "":
        return None
    name = "RedriveAllowPolicy"
    doc = _json_object(name, value, "Redrive allow policy")
    if isinstance(doc, Rejection):
        return doc
    unknown = sorted(set(doc) - {"redrivePermission", "sourceQueueArns"})
    if unknown:
        return _invalid_parameter(name, value, f"Unknown attribute {unknown[0]}.")
    permission = doc.get("redrivePermission")
    if permission not in ("allowAll", "denyAll", "byQueue"):
        return _invalid_parameter(
            name, value, "redrivePermission must be one of allowAll, denyAll, byQueue."
        )
    arns = doc.get("sourceQueueArns")
    if permission != "byQueue":
        if arns is not None:
            return _invalid_parameter(
                name,
                value,
                "sourceQueueArns can be specified only when redrivePermission is byQueue.",
            )
        return json.dumps({"redrivePermission": permission}, separators=(",", ":"))
    if not isinstance(arns, list) or not arns:
        return _invalid_parameter(
            name, value, "sourceQueueArns is required when redrivePermission is byQueue."
        )
    if len(arns) > _REDRIVE_ALLOW_SOURCE_ARNS_MAX:
        return _invalid_parameter(
            name,
            value,
            f"Maximum number of sourceQueueArns is {_REDRIVE_ALLOW_SOURCE_ARNS_MAX}.",
        )
    for arn in arns:
        if not isinstance(arn, str) or parse_queue_arn(arn) is None:
            return _invalid_parameter(name, value, f"Invalid value for sourceQueueArns: {arn}.")
    return json.dumps(
        {"redrivePermission": permission, "sourceQueueArns": arns}, separators=(",", ":")
    )
