"""Queue names and queue ARNs, validated as SQS does.

Pure: no I/O, no clock. Failures are returned as ``Rejection`` values.
"""

from __future__ import annotations

import re

from sqsq.core import limits
from sqsq.errors import ErrorCode, Rejection, reject

FIFO_SUFFIX = ".fifo"

# re.ASCII so that non-ASCII digits/letters (which \d and \w would accept) are rejected.
_QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)
_ARN_RE = re.compile(
    r"arn:(aws(?:-[a-z]+)*):sqs:([a-z0-9-]+):([0-9]{12}):([A-Za-z0-9_.-]+)", re.ASCII
)

NAME_MESSAGE = (
    "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
)


def validate_queue_name(name: str) -> Rejection | None:
    """1-80 chars of [A-Za-z0-9_-]; a FIFO name adds ".fifo", which counts toward the 80."""
    base = name[: -len(FIFO_SUFFIX)] if name.endswith(FIFO_SUFFIX) else name
    if len(name) > limits.QUEUE_NAME_MAX_LEN or not _QUEUE_NAME_RE.fullmatch(base):
        return reject(ErrorCode.INVALID_PARAMETER_VALUE, NAME_MESSAGE)
    return None


def parse_queue_arn(arn: str) -> tuple[str, str, str] | None:
    """(region, account, name) of an SQS queue ARN, or None if it is not one."""
    m = _ARN_RE.fullmatch(arn)
    if m is None or validate_queue_name(m.group(4)) is not None:
        return None
    return m.group(2), m.group(3), m.group(4)
