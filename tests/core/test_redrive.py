"""Message move tasks out of a dead-letter queue, driven by Sweep under a fake clock."""

from __future__ import annotations

import base64
import json

from coresupport import Core
from sqsq.core import commands as c
from sqsq.core import redrive
from sqsq.errors import Rejection


def arn(name: str) -> str:
    return f"arn:aws:sqs:us-east-1:000000000000:{name}"


def dead_lettered(n: int) -> Core:
    """A core whose queue "src" has dead-lettered ``n`` messages into "dlq"."""
    k = Core()
    k.create("dlq")
    k.create("src", RedrivePolicy=json.dumps({"deadLetterTargetArn": arn("dlq"),
                                              "maxReceiveCount": 1}))
    for i in range(n):
        k.send("src", f"m{i}")
    k.receive("src", 10, timeout=0)
    assert k.receive("src", 10) == []  # the second receive dead-letters every message
    assert k.depth("dlq") == (n, 0, 0)
    return k


def start(k: Core, **kw: object) -> str:
    res = k.run(redrive.StartMoveTask(arn("dlq"), task_handle="task-1", **kw))
    assert isinstance(res, redrive.MoveTaskStarted), res
    return res.task_handle


def task(k: Core) -> redrive.MoveTask:
    (t,) = redrive.tasks_of(k.state(), "dlq")
    return t


def test_moves_back_to_the_source_at_the_rate() -> None:
    k = dead_lettered(5)
    start(k, max_number_of_messages_per_second=2)
    k.advance(1)
    k.run(c.Sweep())
    assert (task(k).moved, k.depth("src")[0]) == (2, 2)  # two a second, no faster
    k.advance(2)
    k.run(c.Sweep())
    t = task(k)
    assert (t.status, t.moved, t.to_move) == (redrive.COMPLETED, 5, 5)
    assert k.depth("src") == (5, 0, 0) and k.depth("dlq") == (0, 0, 0)


def test_a_chosen_destination_that_was_deleted_fails_the_task() -> None:
    k = dead_lettered(2)
    k.create("elsewhere")
    start(k, destination_arn=arn("elsewhere"))
    k.run(c.DeleteQueue("elsewhere"))
    k.advance(1)
    k.run(c.Sweep())
    t = task(k)
    assert t.status == redrive.FAILED and t.moved == 0
    # Not sent to the messages' source queue instead: they wait in the dead-letter queue.
    assert k.depth("src") == (0, 0, 0) and k.depth("dlq") == (2, 0, 0)


def test_cancel_stops_the_move() -> None:
    k = dead_lettered(4)
    handle = start(k, max_number_of_messages_per_second=1)
    k.advance(1)
    k.run(c.Sweep())
    res = k.run(redrive.CancelMoveTask(handle))
    assert res == redrive.MoveTaskCancelled(1)
    k.advance(10)
    k.run(c.Sweep())
    assert task(k).status == redrive.CANCELLED
    assert k.depth("src") == (1, 0, 0) and k.depth("dlq") == (3, 0, 0)
    assert isinstance(k.run(redrive.CancelMoveTask(handle)), Rejection)


def test_task_handles_are_amazons_shape_and_cancel_says_what_is_wrong() -> None:
    k = dead_lettered(2)
    handle = start(k, max_number_of_messages_per_second=1)
    doc = json.loads(base64.b64decode(handle))
    assert doc["sourceArn"] == arn("dlq") and len(doc["taskId"]) == 36
    # A second task for the same source is refused while the first runs.
    again = k.run(redrive.StartMoveTask(arn("dlq"), task_handle="task-2"))
    assert isinstance(again, Rejection) and again.sqs_code == "InvalidParameterValue"
    assert again.message == ("There is already a task running. Only one active task is "
                             "allowed for a source queue arn at a given time.")

    def cancel(h: str) -> Rejection:
        res = k.run(redrive.CancelMoveTask(h))
        assert isinstance(res, Rejection)
        return res

    bad = cancel("not-a-handle")
    assert (bad.sqs_code, bad.message) == ("InvalidParameterValue",
                                           "Value for parameter TaskHandle is invalid.")
    gone = cancel(redrive.make_task_handle("x", arn("no-such-queue")))
    assert (gone.sqs_code, gone.message) == (
        "ResourceNotFoundException",
        "The resource that you specified for the SourceArn parameter doesn't exist.")
    unknown = cancel(redrive.make_task_handle("other", arn("dlq")))
    assert (unknown.sqs_code, unknown.message) == ("ResourceNotFoundException",
                                                   "Task does not exist.")
    assert k.run(redrive.CancelMoveTask(handle)) == redrive.MoveTaskCancelled(0)
