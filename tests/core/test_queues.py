"""Queue administration through the pure core: create, delete, set attributes, purge."""

from __future__ import annotations

import json

from coresupport import Core
from sqsq.core import commands as c
from sqsq.errors import ErrorCode, Rejection


def code(res: c.Result) -> ErrorCode:
    assert isinstance(res, Rejection), res
    return res.code


def sent_id(res: c.Result) -> str:
    assert isinstance(res, c.BatchResult) and not res.failed, res
    return res.successful[0].message_id


def test_create_is_idempotent_with_same_attributes() -> None:
    k = Core()
    assert k.create("q", VisibilityTimeout=45, DelaySeconds=3) == c.QueueCreated("q")
    mid = sent_id(k.send("q", "x"))
    k.advance(10)
    assert k.create("q", VisibilityTimeout=45, DelaySeconds=3) == c.QueueCreated("q")
    assert k.create("q", DelaySeconds=3, VisibilityTimeout=45) == c.QueueCreated("q")
    a = k.attrs("q")
    assert a["VisibilityTimeout"] == "45" and a["DelaySeconds"] == "3"
    assert a["CreatedTimestamp"] == str((k.now_ms - 10_000) // 1000)
    # The existing queue and its message survive the repeated create.
    (m,) = k.receive("q")
    assert m.message_id == mid


def test_create_with_different_attributes_is_queue_already_exists() -> None:
    k = Core()
    k.create("q", VisibilityTimeout=45)
    sent_id(k.send("q", "x"))
    assert code(k.create("q", VisibilityTimeout=46)) is ErrorCode.QUEUE_ALREADY_EXISTS
    assert code(k.create("q", VisibilityTimeout=45, DelaySeconds=5)) is \
        ErrorCode.QUEUE_ALREADY_EXISTS
    assert k.attrs("q")["VisibilityTimeout"] == "45"
    assert k.attrs("q")["DelaySeconds"] == "0"
    assert k.depth("q") == (1, 0, 0)


def test_create_fifo_idempotent_and_conflicting() -> None:
    k = Core()
    assert k.create("f.fifo", FifoQueue="true", ContentBasedDeduplication="true") == \
        c.QueueCreated("f.fifo")
    assert k.create("f.fifo", FifoQueue="true", ContentBasedDeduplication="true") == \
        c.QueueCreated("f.fifo")
    assert code(k.create("f.fifo", FifoQueue="true", ContentBasedDeduplication="false")) is \
        ErrorCode.QUEUE_ALREADY_EXISTS


def test_queue_deleted_recently() -> None:
    k = Core()
    k.create("q")
    sent_id(k.send("q", "x"))
    assert k.run(c.DeleteQueue("q")) == c.Ok()
    assert code(k.run(c.SendMessages("q", (c.SendEntry("0", "x"),), "", ("id",)))) is \
        ErrorCode.QUEUE_DOES_NOT_EXIST
    assert code(k.run(c.ReceiveMessages("q"))) is ErrorCode.QUEUE_DOES_NOT_EXIST
    assert code(k.run(c.DeleteQueue("q"))) is ErrorCode.QUEUE_DOES_NOT_EXIST
    k.advance(59.999)
    assert code(k.create("q")) is ErrorCode.QUEUE_DELETED_RECENTLY
    k.advance(0.001)
    assert k.create("q") == c.QueueCreated("q")
    # A fresh queue: the old message did not come back.
    assert k.depth("q") == (0, 0, 0)
    assert k.receive("q", 10) == []


def test_queue_deleted_recently_survives_sweep_and_other_names_unaffected() -> None:
    k = Core()
    k.create("q")
    k.run(c.DeleteQueue("q"))
    k.advance(30)
    k.run(c.Sweep())
    assert code(k.create("q")) is ErrorCode.QUEUE_DELETED_RECENTLY
    assert k.create("q2") == c.QueueCreated("q2")
    k.advance(30)
    k.run(c.Sweep())
    assert k.create("q") == c.QueueCreated("q")


def test_recreated_queue_ignores_old_handles() -> None:
    k = Core()
    k.create("q")
    sent_id(k.send("q", "old"))
    (old,) = k.receive("q", timeout=600)
    k.run(c.DeleteQueue("q"))
    k.advance(60)
    k.create("q")
    new = sent_id(k.send("q", "new"))
    res = k.delete("q", old.receipt_handle)
    assert isinstance(res, c.BatchResult) and res.successful == ("0",)  # the message is gone
    assert k.depth("q") == (1, 0, 0)
    assert [m.message_id for m in k.receive("q")] == [new]


def test_deleted_queue_data_is_collected_by_sweep() -> None:
    k = Core()
    k.create("q")
    for i in range(5):
        sent_id(k.send("q", f"m{i}"))
    k.run(c.DeleteQueue("q"))
    k.advance(61)
    while True:
        res = k.run(c.Sweep())
        assert isinstance(res, c.Swept)
        if not res.more:
            break
    leftovers = [key for key in k.store.scan(b"\x00", b"\xff") if key[0][:1] not in (b"s",)]
    assert leftovers == []


def test_set_attributes_takes_effect_for_new_receives() -> None:
    k = Core()
    k.create("q")
    sent_id(k.send("q", "x"))
    assert k.run(c.SetQueueAttributes("q", (("VisibilityTimeout", "5"),))) == c.Ok()
    k.receive("q")
    k.advance(5)
    assert len(k.receive("q")) == 1
    assert k.run(c.SetQueueAttributes("q", (("DelaySeconds", "7"),))) == c.Ok()
    sent_id(k.send("q", "y"))
    assert k.depth("q") == (0, 1, 1)


def test_purge_window_and_missing_queue() -> None:
    k = Core()
    k.create("a")
    k.create("b")
    sent_id(k.send("a", "x"))
    sent_id(k.send("b", "y"))
    assert k.run(c.PurgeQueue("a")) == c.Ok()
    assert k.depth("a") == (0, 0, 0)
    assert k.depth("b") == (1, 0, 0)  # other queues untouched
    assert k.run(c.PurgeQueue("b")) == c.Ok()  # the 60 s rule is per queue
    k.advance(59.999)
    assert code(k.run(c.PurgeQueue("a"))) is ErrorCode.PURGE_QUEUE_IN_PROGRESS
    k.advance(0.001)
    assert k.run(c.PurgeQueue("a")) == c.Ok()


def test_redrive_allow_policy_decides_who_may_dead_letter_here() -> None:
    k = Core()
    arn = "arn:aws:sqs:us-east-1:000000000000:{}".format

    def policy(dlq: str) -> str:
        return json.dumps({"deadLetterTargetArn": arn(dlq), "maxReceiveCount": 3})

    k.create("closed", RedriveAllowPolicy='{"redrivePermission":"denyAll"}')
    k.create("picky", RedriveAllowPolicy=json.dumps(
        {"redrivePermission": "byQueue", "sourceQueueArns": [arn("friend")]}))
    k.create("open", RedriveAllowPolicy='{"redrivePermission":"allowAll"}')
    rej = k.create("src", RedrivePolicy=policy("closed"))
    assert code(rej) is ErrorCode.INVALID_PARAMETER_VALUE
    assert "RedriveAllowPolicy does not allow" in rej.message
    assert code(k.create("stranger", RedrivePolicy=policy("picky"))) is \
        ErrorCode.INVALID_PARAMETER_VALUE
    assert k.create("friend", RedrivePolicy=policy("picky")) == c.QueueCreated("friend")
    assert k.create("src", RedrivePolicy=policy("open")) == c.QueueCreated("src")
    # SetQueueAttributes is held to the same rule.
    rej = k.run(c.SetQueueAttributes("src", (("RedrivePolicy", policy("closed")),)))
    assert code(rej) is ErrorCode.INVALID_PARAMETER_VALUE
    assert json.loads(k.attrs("src", "RedrivePolicy")["RedrivePolicy"])[
        "deadLetterTargetArn"] == arn("open")
