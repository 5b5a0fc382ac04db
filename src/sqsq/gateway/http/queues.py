"""Queue administration and dead-letter redrive actions: parameters in, result out.

Results are dicts in the JSON protocol's shape. Members SQS leaves out when empty are left out.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sqsq.api import QueueService
from sqsq.core import limits
from sqsq.gateway.http.wire import Params, invalid, missing

Result = dict[str, Any]


def _some(**members: Any) -> Result:
    """Only the members that have a value: SQS omits absent and empty optional members."""
    return {k: v for k, v in members.items() if v not in (None, "", [], {})}


def _str_map(p: Params, name: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in p.mapping(name).items()}


async def create_queue(api: QueueService, p: Params) -> Result:
    # The JSON protocol names the tags member "tags"; the query form decodes to "Tags".
    tags = _str_map(p, "tags") or _str_map(p, "Tags")
    url = await api.create_queue(p.queue_named(), _str_map(p, "Attributes"), tags)
    return {"QueueUrl": url}


async def get_queue_url(api: QueueService, p: Params) -> Result:
    return {"QueueUrl": await api.get_queue_url(p.queue_named())}


async def list_queues(api: QueueService, p: Params) -> Result:
    urls, token = await api.list_queues(p.queue_prefix(), p.integer("MaxResults"),
                                        p.text("NextToken") or "")
    return _some(QueueUrls=urls, NextToken=token)


async def delete_queue(api: QueueService, p: Params) -> Result:
    await api.delete_queue(p.queue())
    return {}


async def purge_queue(api: QueueService, p: Params) -> Result:
    await api.purge_queue(p.queue())
    return {}


async def get_queue_attributes(api: QueueService, p: Params) -> Result:
    attrs = await api.get_queue_attributes(p.queue(), p.strings("AttributeNames"))
    return _some(Attributes=attrs)


async def set_queue_attributes(api: QueueService, p: Params) -> Result:
    await api.set_queue_attributes(p.queue(), _str_map(p, "Attributes"))
    return {}


async def tag_queue(api: QueueService, p: Params) -> Result:
    await api.tag_queue(p.queue(), _str_map(p, "Tags"))
    return {}


async def untag_queue(api: QueueService, p: Params) -> Result:
    await api.untag_queue(p.queue(), p.strings("TagKeys"))
    return {}


async def list_queue_tags(api: QueueService, p: Params) -> Result:
    return _some(Tags=await api.list_queue_tags(p.queue()))


async def list_dead_letter_source_queues(api: QueueService, p: Params) -> Result:
    urls = await api.list_dead_letter_source_queues(p.queue())
    # Paged like SQS (the token is an offset): the source list of one DLQ is small.
    token = p.text("NextToken") or "0"
    start = int(token) if token.isdigit() else 0
    limit = p.integer("MaxResults")
    if limit is not None and not 1 <= limit <= limits.LIST_QUEUES_MAX_RESULTS:
        raise invalid(f"Value {limit} for parameter MaxResults is invalid. Reason: MaxResults "
                      f"must be an integer between 1 and {limits.LIST_QUEUES_MAX_RESULTS}.")
    page = urls[start:start + limit] if limit else urls[start:]
    more = limit is not None and start + limit < len(urls)
    result: Result = {"queueUrls": page}  # a required member: sent even when empty
    if more:
        result["NextToken"] = str(start + (limit or 0))
    return result


async def start_message_move_task(api: QueueService, p: Params) -> Result:
    handle = await api.start_message_move_task(
        p.required("SourceArn"), p.text("DestinationArn"),
        p.integer("MaxNumberOfMessagesPerSecond"))
    return {"TaskHandle": handle}


async def list_message_move_tasks(api: QueueService, p: Params) -> Result:
    tasks = await api.list_message_move_tasks(p.required("SourceArn"), p.integer("MaxResults"))
    return {"Results": [{k: v for k, v in t.items() if v is not None} for t in tasks]}


async def cancel_message_move_task(api: QueueService, p: Params) -> Result:
    moved = await api.cancel_message_move_task(p.required("TaskHandle"))
    return {"ApproximateNumberOfMessagesMoved": moved}


# ---- AddPermission / RemovePermission: statements in the queue's Policy attribute ----------
_LABEL_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
_PERMISSION_ACTIONS = frozenset({
    "*", "SendMessage", "ReceiveMessage", "DeleteMessage", "ChangeMessageVisibility",
    "GetQueueAttributes", "GetQueueUrl", "ListDeadLetterSourceQueues", "PurgeQueue",
    "ListQueueTags", "ListMessageMoveTasks", "StartMessageMoveTask", "CancelMessageMoveTask",
})


def _label(p: Params) -> str:
    label = p.required("Label")
    if not _LABEL_RE.fullmatch(label):
        raise invalid(f"Value {label} for parameter Label is invalid. Reason: Must be at most 80 "
                      "alphanumeric characters, hyphens or underscores.")
    return label


def _one_or_list(items: list[str]) -> str | list[str]:
    return items[0] if len(items) == 1 else items


async def _policy(api: QueueService, queue: str) -> tuple[str, dict[str, Any]]:
    attrs = await api.get_queue_attributes(queue, ["QueueArn", "Policy"])
    arn = attrs["QueueArn"]
    doc = json.loads(attrs["Policy"]) if attrs.get("Policy") else {}
    if not isinstance(doc.get("Statement"), list):
        doc = {"Version": "2008-10-17", "Id": f"{arn}/SQSDefaultPolicy", "Statement": []}
    return arn, doc


async def add_permission(api: QueueService, p: Params) -> Result:
    """As Amazon: one statement (Sid = Label) added to the queue's Policy attribute. A read,
    then a write: two concurrent calls on one queue may lose one (not atomic, unlike SQS)."""
    queue, label = p.queue(), _label(p)
    accounts, actions = p.strings("AWSAccountIds"), p.strings("Actions")
    if not accounts:
        raise missing("AWSAccountIds")
    if not actions:
        raise missing("Actions")
    for action in actions:
        if action not in _PERMISSION_ACTIONS:
            raise invalid(f"Value SQS:{action} for parameter ActionName is invalid. Reason: "
                          "Please refer to the appropriate WSDL for a list of valid actions.")
    arn, doc = await _policy(api, queue)
    if any(s.get("Sid") == label for s in doc["Statement"] if isinstance(s, dict)):
        raise invalid(f"Value {label} for parameter Label is invalid. Reason: Already exists.")
    doc["Statement"].append({
        "Sid": label, "Effect": "Allow",
        "Principal": {"AWS": _one_or_list([f"arn:aws:iam::{a}:root" for a in accounts])},
        "Action": _one_or_list([f"SQS:{a}" for a in actions]),
        "Resource": arn,
    })
    await api.set_queue_attributes(queue, {"Policy": json.dumps(doc, separators=(",", ":"))})
    return {}


async def remove_permission(api: QueueService, p: Params) -> Result:
    queue, label = p.queue(), _label(p)
    _, doc = await _policy(api, queue)
    kept = [s for s in doc["Statement"] if not (isinstance(s, dict) and s.get("Sid") == label)]
    if len(kept) == len(doc["Statement"]):
        raise invalid(f"Value {label} for parameter Label is invalid. Reason: can't find label.")
    doc["Statement"] = kept
    policy = json.dumps(doc, separators=(",", ":")) if kept else ""  # "": no Policy at all
    await api.set_queue_attributes(queue, {"Policy": policy})
    return {}
