"""Regions in the pure core: a queue's key is its name in the configured region (what the
store always held, so old data reads unchanged) and "<region>/<name>" elsewhere."""

from __future__ import annotations

import json

import pytest

from coresupport import CONFIG, Core
from sqsq.core import commands as c
from sqsq.core import keys, queries, regions
from sqsq.errors import ErrorCode, Rejection

HOME = CONFIG.region  # us-east-1
EU = "eu-west-1/"


def test_keys_map_one_to_one_and_keep_the_configured_regions_names() -> None:
    assert regions.queue_key(HOME, "jobs", HOME) == "jobs"
    assert keys.queue_key("jobs") == b"qjobs"  # the key every existing store holds
    assert regions.queue_key("eu-west-1", "jobs", HOME) == "eu-west-1/jobs"
    for region, name in ((HOME, "jobs"), ("eu-west-1", "jobs.fifo"), (HOME, "a/b")):
        assert regions.split_key(regions.queue_key(region, name, HOME), HOME) == (region, name)
    # A name holding the separator is kept behind its region, never read as one.
    assert regions.queue_key(HOME, "eu-west-1/jobs", HOME) == f"{HOME}/eu-west-1/jobs"
    assert regions.queue_arn(EU + "jobs", HOME, "000000000000") == \
        "arn:aws:sqs:eu-west-1:000000000000:jobs"
    assert regions.key_of_arn("arn:aws:sqs:us-east-1:000000000000:jobs", HOME,
                              "000000000000") == "jobs"
    assert regions.key_of_arn("arn:aws:sqs:us-east-1:111111111111:jobs", HOME,
                              "000000000000") is None


def test_the_same_name_in_two_regions_is_two_queues() -> None:
    k = Core()
    assert k.create("jobs", VisibilityTimeout=10) == c.QueueCreated("jobs")
    assert k.create(EU + "jobs", VisibilityTimeout=20) == c.QueueCreated(EU + "jobs")
    k.send(EU + "jobs", "eu")
    assert k.receive("jobs") == []
    assert [m.body for m in k.receive(EU + "jobs")] == ["eu"]
    assert k.attrs("jobs", "QueueArn", "VisibilityTimeout") == {
        "QueueArn": "arn:aws:sqs:us-east-1:000000000000:jobs", "VisibilityTimeout": "10"}
    assert k.attrs(EU + "jobs", "QueueArn")["QueueArn"] == \
        "arn:aws:sqs:eu-west-1:000000000000:jobs"
    st = k.state()
    assert queries.list_queues(st, "") == (["jobs"], "")
    assert queries.list_queues(st, EU) == ([EU + "jobs"], "")
    assert queries.list_queues(st, "e") == ([], "")  # the home prefix "e": no eu-west-1/...


@pytest.mark.parametrize("key", ["us-east-1/a/b", "eu-west-1/a/b", "Bad_Region/jobs"])
def test_a_key_that_names_no_valid_queue_is_refused(key: str) -> None:
    res = Core().create(key)
    assert isinstance(res, Rejection) and res.code == ErrorCode.INVALID_PARAMETER_VALUE


def test_a_dead_letter_target_in_another_region_does_not_exist() -> None:
    k = Core()
    k.create(EU + "dlq")
    k.create("dlq")
    eu_dlq = "arn:aws:sqs:eu-west-1:000000000000:dlq"
    policy = json.dumps({"deadLetterTargetArn": eu_dlq, "maxReceiveCount": 1})
    res = k.create("src", RedrivePolicy=policy)
    assert isinstance(res, Rejection) and res.message.endswith(
        "Reason: Dead-letter target does not exist.")
    assert k.create(EU + "src", RedrivePolicy=policy) == c.QueueCreated(EU + "src")
    k.send(EU + "src", "poison")
    k.receive(EU + "src", timeout=0)
    assert k.receive(EU + "src") == []  # the second receive moved it
    assert [m.body for m in k.receive(EU + "dlq")] == ["poison"]
    assert k.receive("dlq") == []
    st = k.state()
    assert queries.dead_letter_source_queues(st, EU + "dlq") == [EU + "src"]
    assert queries.dead_letter_source_queues(st, "dlq") == []
