"""Queue attributes: parsing, validation and rendering, as SQS does them.

Pure: no I/O, no clock. Failures are returned as ``Rejection`` values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sqsq.core import limits
from sqsq.core.names import FIFO_SUFFIX, NAME_MESSAGE
from sqsq.core.redrivepolicy import (
    INT_RE,
    RedrivePolicy,
    parse_redrive_allow_policy,
    parse_redrive_policy,
)
from sqsq.errors import ErrorCode, Rejection, reject

# Names whose values are kept verbatim and echoed back, but not acted on.
_EXTRA_NAMES = frozenset(
    {"Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "SqsManagedSseEnabled"}
)
# SQS keeps these only on FIFO queues.
_FIFO_ONLY_NAMES = frozenset(
    {"ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit"}
)

SETTABLE_ATTRIBUTE_NAMES: frozenset[str] = frozenset(
    {
        "VisibilityTimeout",
        "DelaySeconds",
        "MessageRetentionPeriod",
        "MaximumMessageSize",
        "ReceiveMessageWaitTimeSeconds",
        "RedrivePolicy",
        "RedriveAllowPolicy",
        "FifoQueue",
        *_FIFO_ONLY_NAMES,
        *_EXTRA_NAMES,
    }
)

# (attribute name, dataclass field, (min, max[, default])) for the plain integer attributes.
_INT_ATTRIBUTES: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("VisibilityTimeout", "visibility_timeout_s", limits.VISIBILITY_TIMEOUT_S),
    ("DelaySeconds", "delay_seconds", limits.DELAY_SECONDS),
    ("MessageRetentionPeriod", "message_retention_period_s", limits.MESSAGE_RETENTION_PERIOD_S),
    ("MaximumMessageSize", "maximum_message_size", limits.MAXIMUM_MESSAGE_SIZE_BYTES),
    (
        "ReceiveMessageWaitTimeSeconds",
        "receive_message_wait_time_s",
        limits.RECEIVE_MESSAGE_WAIT_TIME_S,
    ),
)
# SQS's bounds for the KMS data key reuse period (seconds); echoed only, but still validated.
_KMS_REUSE_PERIOD_S = (60, 86_400)

_FIFO_NAME_MESSAGE = (
    "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
    "underscores, must end with .fifo suffix and be 1 to 80 in length."
)


@dataclass(frozen=True)
class QueueAttributes:
    visibility_timeout_s: int = limits.VISIBILITY_TIMEOUT_S[2]
    delay_seconds: int = limits.DELAY_SECONDS[2]
    message_retention_period_s: int = limits.MESSAGE_RETENTION_PERIOD_S[2]
    maximum_message_size: int = limits.MAXIMUM_MESSAGE_SIZE_BYTES[2]
    receive_message_wait_time_s: int = limits.RECEIVE_MESSAGE_WAIT_TIME_S[2]
    redrive_policy: RedrivePolicy | None = None
    redrive_allow_policy: str | None = None  # validated JSON, stored normalized
    fifo_queue: bool = False
    content_based_deduplication: bool = False
    deduplication_scope: str = "queue"  # "queue" | "messageGroup"
    # The scope deduplication works by: the one set at creation. Amazon lets a later
    # SetQueueAttributes change the attribute, not the behaviour. None: deduplication_scope.
    deduplication_scope_in_effect: str | None = None
    fifo_throughput_limit: str = "perQueue"  # "perQueue" | "perMessageGroupId"
    # Accepted and echoed, not acted on; sorted by name so equal settings compare equal.
    extra: tuple[tuple[str, str], ...] = ()


def _invalid_value(name: str, reason: str | None = None) -> Rejection:
    msg = f"Invalid value for the parameter {name}."
    if reason:
        msg = f"{msg[:-1]}. Reason: {reason}"
    return reject(ErrorCode.INVALID_ATTRIBUTE_VALUE, msg)


def _parse_int(name: str, value: str, lo: int, hi: int) -> int | Rejection:
    if not INT_RE.fullmatch(value):
        return _invalid_value(name)
    n = int(value)
    if not lo <= n <= hi:
        return _invalid_value(name)
    return n


def _parse_bool(name: str, value: str) -> bool | Rejection:
    lowered = value.lower()
    if lowered not in ("true", "false"):
        return _invalid_value(name)
    return lowered == "true"


def _parse_extra(name: str, value: str) -> str | None | Rejection:
    """Validated value to keep, or None to drop the attribute (SQS drops empty ones)."""
    if name == "KmsDataKeyReusePeriodSeconds":
        n = _parse_int(name, value, *_KMS_REUSE_PERIOD_S)
        return n if isinstance(n, Rejection) else str(n)
    if name == "SqsManagedSseEnabled":
        b = _parse_bool(name, value)
        return b if isinstance(b, Rejection) else str(b).lower()
    if value == "":
        return None  # empty Policy / KmsMasterKeyId clears it
    if name == "Policy":
        try:
            doc = json.loads(value)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return _invalid_value(name)
    return value


def _unknown_on_standard(name: str) -> Rejection:
    # SQS does not know the attribute at all on a standard queue, whatever its value
    # ("FifoQueue": "false" included).
    return reject(ErrorCode.INVALID_ATTRIBUTE_NAME, f"Unknown Attribute {name}.")


def parse_queue_attributes(
    raw: Mapping[str, str],
    *,
    queue_name: str,
    base: QueueAttributes | None = None,
) -> QueueAttributes | Rejection:
    """Apply ``raw`` to ``base`` (None: CreateQueue, from the defaults; else SetQueueAttributes).

    Checks names first (as SQS does), then values, then the FIFO-ness rules.
    """
    creating = base is None
    for name in raw:
        if name not in SETTABLE_ATTRIBUTE_NAMES:
            return reject(ErrorCode.INVALID_ATTRIBUTE_NAME, f"Unknown Attribute {name}.")

    # Whether the queue is (to be) FIFO decides which attributes exist.
    if creating:
        fifo_raw = raw.get("FifoQueue")
        fifo = False
        if fifo_raw is not None:
            parsed = _parse_bool("FifoQueue", fifo_raw)
            if isinstance(parsed, Rejection):
                return parsed
            fifo = parsed
        if fifo and not queue_name.endswith(FIFO_SUFFIX):
            return reject(ErrorCode.INVALID_PARAMETER_VALUE, _FIFO_NAME_MESSAGE)
        if not fifo and queue_name.endswith(FIFO_SUFFIX):
            # SQS answers a ".fifo" standard queue with the plain name message.
            return reject(ErrorCode.INVALID_PARAMETER_VALUE, NAME_MESSAGE)
        if fifo_raw is not None and not fifo:
            return _unknown_on_standard("FifoQueue")
        attrs = QueueAttributes(fifo_queue=fifo)
    else:
        assert base is not None
        attrs = base
        fifo = base.fifo_queue
        if "FifoQueue" in raw and not fifo:
            return _unknown_on_standard("FifoQueue")
        if "FifoQueue" in raw:
            parsed = _parse_bool("FifoQueue", raw["FifoQueue"])
            if isinstance(parsed, Rejection):
                return parsed
            if parsed != fifo:
                return _invalid_value("FifoQueue", "Modifying queue type is not supported.")

    if not fifo:
        for name in ("DeduplicationScope", "FifoThroughputLimit"):
            if name in raw:
                return reject(
                    ErrorCode.INVALID_ATTRIBUTE_NAME,
                    f"You can specify the {name} only when FifoQueue is set to true.",
                )
        if "ContentBasedDeduplication" in raw:
            return _unknown_on_standard("ContentBasedDeduplication")

    changes: dict[str, Any] = {}
    for name, field, bounds in _INT_ATTRIBUTES:
        if name in raw:
            n = _parse_int(name, raw[name], bounds[0], bounds[1])
            if isinstance(n, Rejection):
                return n
            changes[field] = n

    if "RedrivePolicy" in raw:
        policy = parse_redrive_policy(raw["RedrivePolicy"])
        if isinstance(policy, Rejection):
            return policy
        changes["redrive_policy"] = policy
    if "RedriveAllowPolicy" in raw:
        allow = parse_redrive_allow_policy(raw["RedriveAllowPolicy"])
        if isinstance(allow, Rejection):
            return allow
        changes["redrive_allow_policy"] = allow

    if "ContentBasedDeduplication" in raw:
        cbd = _parse_bool("ContentBasedDeduplication", raw["ContentBasedDeduplication"])
        if isinstance(cbd, Rejection):
            return cbd
        changes["content_based_deduplication"] = cbd
    for name, field, allowed in (
        ("DeduplicationScope", "deduplication_scope", ("queue", "messageGroup")),
        ("FifoThroughputLimit", "fifo_throughput_limit", ("perQueue", "perMessageGroupId")),
    ):
        if name in raw:
            if raw[name] not in allowed:
                return _invalid_value(name)
            changes[field] = raw[name]

    if any(name in raw for name in _EXTRA_NAMES):
        extra = dict(attrs.extra)
        for name in sorted(_EXTRA_NAMES & raw.keys()):
            kept = _parse_extra(name, raw[name])
            if isinstance(kept, Rejection):
                return kept
            if kept is None:
                extra.pop(name, None)
            else:
                extra[name] = kept
        changes["extra"] = tuple(sorted(extra.items()))

    merged = replace(attrs, **changes)
    if creating and fifo:
        merged = replace(merged, deduplication_scope_in_effect=merged.deduplication_scope)
    if merged.fifo_throughput_limit == "perMessageGroupId" and \
            merged.deduplication_scope != "messageGroup" and \
            ("FifoThroughputLimit" in raw or "DeduplicationScope" in raw):
        return _invalid_value("FifoThroughputLimit", "perMessageGroupId is allowed only when "
                              "DeduplicationScope is messageGroup.")
    return merged


def render_queue_attributes(attrs: QueueAttributes) -> dict[str, str]:
    """The settable attributes as GetQueueAttributes reports them (all values strings)."""
    out = {
        "VisibilityTimeout": str(attrs.visibility_timeout_s),
        "DelaySeconds": str(attrs.delay_seconds),
        "MessageRetentionPeriod": str(attrs.message_retention_period_s),
        "MaximumMessageSize": str(attrs.maximum_message_size),
        "ReceiveMessageWaitTimeSeconds": str(attrs.receive_message_wait_time_s),
    }
    if attrs.redrive_policy is not None:
        out["RedrivePolicy"] = attrs.redrive_policy.to_json()
    if attrs.redrive_allow_policy is not None:
        out["RedriveAllowPolicy"] = attrs.redrive_allow_policy
    if attrs.fifo_queue:
        out["FifoQueue"] = "true"
        out["ContentBasedDeduplication"] = str(attrs.content_based_deduplication).lower()
        out["DeduplicationScope"] = attrs.deduplication_scope
        out["FifoThroughputLimit"] = attrs.fifo_throughput_limit
    extra = dict(attrs.extra)
    if "KmsMasterKeyId" not in extra:
        extra.pop("KmsDataKeyReusePeriodSeconds", None)  # Amazon shows it only with a key
    out.update(extra)
    if "SqsManagedSseEnabled" not in extra:
        # New SQS queues get SSE-SQS by default unless a KMS key was chosen.
        out["SqsManagedSseEnabled"] = "false" if "KmsMasterKeyId" in extra else "true"
    return out
