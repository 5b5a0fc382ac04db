"""Queue administration and dead-letter redrive actions: parameters in, result out.

Results are dicts in the JSON protocol's shape. Members SQS leaves out when empty are left out.
"""

from __future__ import annotations

from typing import Any

from sqsq.api import QueueService
from sqsq.core import limits
from sqsq.gateway.http.wire import Params, invalid

Result = dict[str, Any]


def _some(**members: Any) -> Result:
    """Only the members that have a value: SQS omits absent and empty optional members."""
    return {k: v for k, v in members.items() if v not in (None, "", [], {})}


def _str_map(p: Params, name: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in p.mapping(name).items()}


async def create_queue(api: QueueService, p: Params) -> Result:
    # The JSON protocol names the tags member "tags"; the query form decodes to "Tags".
    tags = _str_map(p, "tags") or _str_map(p, "Tags")
    url = await api.create_queue(p.required("QueueName"), _str_map(p, "Attributes"), tags)
    return {"QueueUrl": url}


async def get_queue_url(api: QueueService, p: Params) -> Result:
    return {"QueueUrl": await api.get_queue_url(p.required("QueueName"))}


async def list_queues(api: QueueService, p: Params) -> Result:
    urls, token = await api.list_queues(p.text("QueueNamePrefix") or "",
                                        p.integer("MaxResults"), p.text("NextToken") or "")
    return _some(QueueUrls=urls, NextToken=token)


async def delete_queue(api: QueueService, p: Params) -> Result:
    await api.delete_queue(p.queue_url())
    return {}


async def purge_queue(api: QueueService, p: Params) -> Result:
    await api.purge_queue(p.queue_url())
    return {}


async def get_queue_attributes(api: QueueService, p: Params) -> Result:
    attrs = await api.get_queue_attributes(p.queue_url(), p.strings("AttributeNames"))
    return _some(Attributes=attrs)


async def set_queue_attributes(api: QueueService, p: Params) -> Result:
    await api.set_queue_attributes(p.queue_url(), _str_map(p, "Attributes"))
    return {}


async def tag_queue(api: QueueService, p: Params) -> Result:
    await api.tag_queue(p.queue_url(), _str_map(p, "Tags"))
    return {}


async def untag_queue(api: QueueService, p: Params) -> Result:
    await api.untag_queue(p.queue_url(), p.strings("TagKeys"))
    return {}


async def list_queue_tags(api: QueueService, p: Params) -> Result:
    return _some(Tags=await api.list_queue_tags(p.queue_url()))


async def list_dead_letter_source_queues(api: QueueService, p: Params) -> Result:
    urls = await api.list_dead_letter_source_queues(p.queue_url())
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
