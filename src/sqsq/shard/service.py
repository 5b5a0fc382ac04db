"""The shard service: every SQS action over this process's shard engine, as coroutines.

What a node serves (and ``sqsq server`` in single-node mode): check request parameters
against ``limits``, build the command, hand it to the engine (which proposes it to the
shard's Raft group), turn a ``Rejection`` into the ``QueueError`` for its SQS code, and park
long polls until the leader's effects wake them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from sqsq.api import SYSTEM_ATTRIBUTE_NAMES, Endpoint, wants_attribute
from sqsq.core import commands as c
from sqsq.core import limits, peek, queries, redrive, sending
from sqsq.core.messages import (
    md5_of_message_attributes,
    validate_batch_entry_ids,
    validate_fifo_id,
)
from sqsq.errors import ErrorCode, QueueDoesNotExist, QueueError, Rejection, from_rejection, reject
from sqsq.shard.engine import ShardEngine


def _raise(rejection: Rejection) -> None:
    raise from_rejection(rejection)


def _invalid(message: str) -> QueueError:
    return from_rejection(reject(ErrorCode.INVALID_PARAMETER_VALUE, message))


def _check_range(name: str, value: int | None, lo: int, hi: int) -> None:
    if value is not None and not lo <= value <= hi:
        raise _invalid(
            f"Value {value} for parameter {name} is invalid. Reason: Must be between {lo} and "
            f"{hi}, if provided."
        )


class ShardService:
    """``QueueService`` over a shard engine in this process. Queues are named by their keys,
    which the commands carry as they are."""

    def __init__(self, engine: ShardEngine, endpoint: Endpoint) -> None:
        self.engine = engine
        self.endpoint = endpoint

    async def _run(self, command: c.Command) -> c.Result:
        result = await self.engine.submit(command)
        if isinstance(result, Rejection):
            _raise(result)
        return result

    async def _query(self, fn, *args):  # noqa: ANN001, ANN202 - a thin pass-through
        result = await self.engine.read(fn, *args)
        if isinstance(result, Rejection):
            _raise(result)
        return result

    # ---- queues ----
    async def create_queue(
        self, name: str, attributes: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> str:
        await self._run(c.CreateQueue(name, tuple((attributes or {}).items()),
                                      tuple((tags or {}).items())))
        return self.endpoint.queue_url(name)

    async def get_queue_url(self, name: str) -> str:
        await self._query(lambda st, n, now: queries.queue(st, n), name)
        return self.endpoint.queue_url(name)

    async def list_queues(
        self, prefix: str = "", max_results: int | None = None, next_token: str = ""
    ) -> tuple[list[str], str]:
        keys, token = await self._query(
            lambda st, now: queries.list_queues(st, prefix, max_results, next_token)
        )
        return [self.endpoint.queue_url(k) for k in keys], token

    async def delete_queue(self, queue: str) -> None:
        await self._run(c.DeleteQueue(queue))

    async def purge_queue(self, queue: str) -> None:
        await self._run(c.PurgeQueue(queue))

    async def get_queue_attributes(self, queue: str, names: list[str]) -> dict[str, str]:
        return await self._query(queries.queue_attributes, queue, list(names))

    async def set_queue_attributes(self, queue: str, attributes: Mapping[str, str]) -> None:
        await self._run(c.SetQueueAttributes(queue, tuple(attributes.items())))

    async def tag_queue(self, queue: str, tags: Mapping[str, str]) -> None:
        await self._run(c.TagQueue(queue, tuple(tags.items())))

    async def untag_queue(self, queue: str, keys: Iterable[str]) -> None:
        await self._run(c.UntagQueue(queue, tuple(keys)))

    async def list_queue_tags(self, queue: str) -> dict[str, str]:
        return await self._query(lambda st, k, now: queries.queue_tags(st, k), queue)

    async def list_dead_letter_source_queues(self, queue: str) -> list[str]:
        keys = await self._query(lambda st, k, now: queries.dead_letter_source_queues(st, k),
                                 queue)
        return [self.endpoint.queue_url(k) for k in keys]

    async def peek_messages(self, queue: str, max_number_of_messages: int) -> peek.Peek:
        """Not an SQS action: the web console's look at a queue's oldest messages, read as
        GetQueueAttributes is and changing nothing."""
        return await self._query(peek.peek_messages, queue, max_number_of_messages)

    # ---- dead-letter redrive ----
    async def start_message_move_task(
        self, source_arn: str, destination_arn: str | None = None,
        max_number_of_messages_per_second: int | None = None, task_stamp: str = "",
    ) -> str:
        result = await self._run(redrive.StartMoveTask(
            source_arn, destination_arn or None, max_number_of_messages_per_second,
            task_stamp))
        assert isinstance(result, redrive.MoveTaskStarted)
        return result.task_handle

    async def cancel_message_move_task(self, task_handle: str) -> int:
        result = await self._run(redrive.CancelMoveTask(task_handle))
        assert isinstance(result, redrive.MoveTaskCancelled)
        return result.approximate_number_of_messages_moved

    async def list_message_move_tasks(
        self, source_arn: str, max_results: int | None = None
    ) -> list[dict]:
        """SQS's result shape: newest first, at most ``max_results`` (1-10, default 1)."""
        _check_range("MaxResults", max_results, 1, 10)
        arn_of = self.engine.config.queue_arn

        def run(st, now):  # noqa: ANN001, ANN202
            key = st.config.key_of_arn(source_arn)
            if key is None or st.queue(key) is None:
                return reject(ErrorCode.RESOURCE_NOT_FOUND, "The resource that you specified "
                              "for the SourceArn parameter doesn't exist.")
            tasks = redrive.tasks_of(st, key)[: max_results or 1]
            return [redrive.describe(t, arn_of) for t in tasks]

        return await self._query(run)

    # ---- messages ----
    async def send_message_batch(
        self, queue: str, entries: list[c.SendEntry], request_id: str = ""
    ) -> c.BatchResult:
        command = c.SendMessages(queue, tuple(entries), request_id)
        rej = sending.check_batch(command)  # the request's shape first, as SQS answers
        if rej is not None:
            _raise(rej)
        for e in entries:
            if e.body is None or e.body == "":
                raise from_rejection(reject(
                    ErrorCode.MISSING_PARAMETER, "The request must contain the parameter "
                    "MessageBody."))
        result = await self.engine.submit(command)  # (not ``_run``: a coroutine less)
        if isinstance(result, Rejection):
            _raise(result)
        assert isinstance(result, c.BatchResult)
        return result

    async def receive_message(
        self,
        queue: str,
        max_number_of_messages: int | None = None,  # SQS's default: 1
        visibility_timeout: int | None = None,
        wait_time_seconds: int | None = None,
        attribute_names: Iterable[str] = (),
        message_attribute_names: Iterable[str] = (),
        receive_request_attempt_id: str = "",
    ) -> list[c.ReceivedMessage]:
        _check_range("MaxNumberOfMessages", max_number_of_messages, 1, limits.RECEIVE_MAX_MESSAGES)
        max_number_of_messages = max_number_of_messages or 1
        _check_range("VisibilityTimeout", visibility_timeout, *limits.VISIBILITY_TIMEOUT_S[:2])
        if wait_time_seconds is not None and \
                not 0 <= wait_time_seconds <= limits.RECEIVE_WAIT_MAX_S:
            raise _invalid(f"Value {wait_time_seconds} for parameter WaitTimeSeconds is invalid. "
                           f"Reason: Must be >= 0 and <= {limits.RECEIVE_WAIT_MAX_S}, if provided.")
        # "ALL" as well as "All": kombu sends it so, and SQS takes it.
        attribute_names = [_all_spelled(n) for n in attribute_names]
        for n in attribute_names:
            # SQS ignores queue attribute names here (boto3's model allows them); others fail.
            if n not in SYSTEM_ATTRIBUTE_NAMES and n not in queries.QUEUE_ATTRIBUTE_NAMES:
                raise from_rejection(reject(ErrorCode.INVALID_ATTRIBUTE_NAME,
                                            f"Unknown Attribute {n}."))
        if receive_request_attempt_id:
            rej = validate_fifo_id(receive_request_attempt_id, "ReceiveRequestAttemptId")
            if rej is not None:
                _raise(rej)
        if wait_time_seconds is None:
            # The queue's own wait time. Read locally only while this replica leads (the
            # receive's own reply then waits for its fsync); a follower's state may lag, and
            # answers NotLeader, never a queue error. A queue this leader has not found (one
            # it has not applied yet, say just after an election) is looked for again after
            # a barrier (ReadIndex): the answer is NonExistentQueue only if it still is not
            # there.
            names = ["ReceiveMessageWaitTimeSeconds"]
            attrs = self.engine.query(queries.queue_attributes, queue, names) \
                if self.engine.replica.is_leader() else None
            if attrs is None or isinstance(attrs, Rejection):
                attrs = await self.engine.read(queries.queue_attributes, queue, names)
            if isinstance(attrs, Rejection):
                _raise(attrs)
            wait_time_seconds = int(attrs["ReceiveMessageWaitTimeSeconds"])
        command = c.ReceiveMessages(queue, max_number_of_messages, visibility_timeout,
                                    receive_request_attempt_id=receive_request_attempt_id)
        deadline = time.monotonic() + wait_time_seconds
        while True:
            # Park before trying, so a send that lands between the try and the wait wakes us.
            woken = self.engine.waiters.event(queue)
            try:
                # answered without a log entry when it finds nothing (``engine.receive``)
                result = await self.engine.receive(command)
                if isinstance(result, Rejection):
                    _raise(result)
            except QueueDoesNotExist:
                self.engine.waiters.forget(queue)  # others polling a real queue keep the event
                raise
            assert isinstance(result, c.Received)
            left = deadline - time.monotonic()
            if result.messages or left <= 0 or not self.engine.long_polls_allowed:
                break
            await self.engine.waiters.park(woken, min(left, 1.0))
        message_names = [_all_spelled(n) for n in message_attribute_names]
        if not attribute_names and not message_names:  # the common receive: neither asked for
            received = c.ReceivedMessage  # (built here: a call to ``_select`` per message less)
            return [received(m.message_id, m.receipt_handle, m.body, m.md5_of_body, None, (), ())
                    for m in result.messages]
        return [_select(m, attribute_names, message_names) for m in result.messages]

    async def delete_message_batch(
        self, queue: str, entries: list[tuple[str, str]]
    ) -> c.BatchResult:
        _check_batch_ids([e[0] for e in entries])
        result = await self.engine.submit(c.DeleteMessages(queue, tuple(entries)))
        if isinstance(result, Rejection):
            _raise(result)
        assert isinstance(result, c.BatchResult)
        return result

    async def change_message_visibility_batch(
        self, queue: str, entries: list[tuple[str, str, int]]
    ) -> c.BatchResult:
        _check_batch_ids([e[0] for e in entries])
        result = await self._run(c.ChangeVisibilities(queue, tuple(entries)))
        assert isinstance(result, c.BatchResult)
        return result


def _all_spelled(name: str) -> str:
    return "All" if name.lower() == "all" else name


def _check_batch_ids(ids: list[str]) -> None:
    rej = validate_batch_entry_ids(ids)
    if rej is not None:
        _raise(rej)


def _select(m: c.ReceivedMessage, attribute_names: list[str],
            message_names: list[str]) -> c.ReceivedMessage:
    """Only the system and message attributes the receiver asked for, as SQS returns them."""
    if not attribute_names and not message_names:  # the common receive: neither asked for
        return c.ReceivedMessage(m.message_id, m.receipt_handle, m.body, m.md5_of_body,
                                 None, (), ())
    want_all = "All" in attribute_names
    attrs = tuple((k, v) for k, v in m.attributes if want_all or k in attribute_names)
    mattrs = tuple((k, v) for k, v in m.message_attributes if wants_attribute(message_names, k))
    # The digest covers what is returned, which is what SDKs check it against.
    md5 = m.md5_of_message_attributes if len(mattrs) == len(m.message_attributes) else (
        md5_of_message_attributes(dict(mattrs)))
    return c.ReceivedMessage(m.message_id, m.receipt_handle, m.body, m.md5_of_body,
                             md5 if mattrs else None, mattrs, attrs)

