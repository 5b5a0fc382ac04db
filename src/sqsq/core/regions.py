"""Regions: as in SQS, each account-and-region pair is a namespace of queues of its own.

Inside sqsq a queue is named by its *key*: its plain name in the configured region (the
"home" region, so data written before regions existed reads unchanged), and
``<region>/<name>`` in any other. A '/' is in no valid queue name and in no region, so the
mapping is one-to-one; a name that holds one anyway is kept behind an explicit region,
where it can name no queue and is refused as a name (never read as a region).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from sqsq.core.names import parse_queue_arn

SEPARATOR = "/"
# The region names botocore accepts, lower case (ARNs are): "us-east-1", "local", ...
_REGION_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?", re.ASCII)
_ARN_PREFIX = "arn:aws:sqs:"


def valid_region(region: str) -> bool:
    return _REGION_RE.fullmatch(region) is not None


def queue_key(region: str, name: str, home: str) -> str:
    """The key of queue ``name`` in ``region``."""
    if region == home and SEPARATOR not in name:
        return name
    return f"{region}{SEPARATOR}{name}"


def split_key(key: str, home: str) -> tuple[str, str]:
    """(region, name) of a queue key."""
    region, sep, name = key.partition(SEPARATOR)
    return (region, name) if sep else (home, key)


def region_of(key: str, home: str) -> str:
    return split_key(key, home)[0]


def name_of(key: str) -> str:
    """The queue's SQS name (what it was created as, without its region)."""
    return key.partition(SEPARATOR)[2] or key


def keys_with_prefix(keys: Iterable[str], prefix: str, home: str) -> Iterator[str]:
    """The keys that start with ``prefix`` (a prefix's key) in the prefix's region: the home
    region's keys are plain names, which another region's key may also start with."""
    region = split_key(prefix, home)[0]
    return (k for k in keys if k.startswith(prefix) and split_key(k, home)[0] == region)


def queue_arn(key: str, home: str, account: str) -> str:
    region, name = split_key(key, home)
    return f"{_ARN_PREFIX}{region}:{account}:{name}"


def key_of_arn(arn: str, home: str, account: str) -> str | None:
    """The key of the queue an ARN names; None when it is no queue ARN or names another
    account."""
    parsed = parse_queue_arn(arn)
    if parsed is None or parsed[1] != account:
        return None
    return queue_key(parsed[0], parsed[2], home)
