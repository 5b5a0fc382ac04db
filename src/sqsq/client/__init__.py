"""The sqsq Python SDK: SQS's actions with boto3's parameter names in snake_case.

    from sqsq.client import Client

    with Client("127.0.0.1:7400") as sqs:
        url = sqs.create_queue("jobs")
        sqs.send_message(url, "hello")
        for m in sqs.receive_message(url, wait_time_seconds=5):
            sqs.delete_message(url, m.receipt_handle)

``AsyncClient`` has the same methods as coroutines. Errors are ``sqsq.errors.QueueError``
subclasses carrying the SQS error code. Concurrent ``send_message``, ``delete_message`` and
``change_message_visibility`` calls to one queue are batched (``batching=BatchSettings(...)``
or ``batching=False`` on the client); ``client.prefetcher(queue)`` receives ahead.
"""

from sqsq.client.aio import AsyncClient
from sqsq.client.batching import BatchSettings
from sqsq.client.prefetch import AsyncPrefetcher, Prefetcher
from sqsq.client.sync import Client
from sqsq.client.types import (
    BatchError,
    BatchResult,
    BatchResultEntry,
    Message,
    SendBatchResultEntry,
    SendResult,
)
from sqsq.errors import QueueError

__all__ = [
    "AsyncClient",
    "AsyncPrefetcher",
    "BatchError",
    "BatchResult",
    "BatchResultEntry",
    "BatchSettings",
    "Client",
    "Message",
    "Prefetcher",
    "QueueError",
    "SendBatchResultEntry",
    "SendResult",
]
