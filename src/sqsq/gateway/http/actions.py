"""SQS action name -> handler. Every handler is ``async (QueueService, Params) -> result dict``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqsq.api import QueueService
from sqsq.gateway.http import messages as m
from sqsq.gateway.http import queues as q
from sqsq.gateway.http.wire import Params

Handler = Callable[[QueueService, Params], Awaitable[dict[str, Any]]]

ACTIONS: dict[str, Handler] = {
    "CreateQueue": q.create_queue,
    "GetQueueUrl": q.get_queue_url,
    "ListQueues": q.list_queues,
    "DeleteQueue": q.delete_queue,
    "PurgeQueue": q.purge_queue,
    "GetQueueAttributes": q.get_queue_attributes,
    "SetQueueAttributes": q.set_queue_attributes,
    "TagQueue": q.tag_queue,
    "UntagQueue": q.untag_queue,
    "ListQueueTags": q.list_queue_tags,
    "ListDeadLetterSourceQueues": q.list_dead_letter_source_queues,
    "StartMessageMoveTask": q.start_message_move_task,
    "ListMessageMoveTasks": q.list_message_move_tasks,
    "CancelMessageMoveTask": q.cancel_message_move_task,
    "AddPermission": q.add_permission,
    "RemovePermission": q.remove_permission,
    "SendMessage": m.send_message,
    "SendMessageBatch": m.send_message_batch,
    "ReceiveMessage": m.receive_message,
    "DeleteMessage": m.delete_message,
    "DeleteMessageBatch": m.delete_message_batch,
    "ChangeMessageVisibility": m.change_message_visibility,
    "ChangeMessageVisibilityBatch": m.change_message_visibility_batch,
}

# Real SQS actions sqsq does not implement: UnsupportedOperation, not InvalidAction.
UNSUPPORTED: frozenset[str] = frozenset()
