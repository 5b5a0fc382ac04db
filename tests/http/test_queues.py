"""Queue administration over the SQS HTTP API with unmodified boto3."""

from __future__ import annotations

import uuid
from typing import Any

import pytest


def test_create_get_url_and_url_shape(sqs: Any, sqs_endpoint: str) -> None:
    name = f"shape-{uuid.uuid4().hex[:8]}"
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    assert url == f"{sqs_endpoint}/000000000000/{name}"
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    # Creating again with the same attributes is idempotent and returns the same URL.
    assert sqs.create_queue(QueueName=name)["QueueUrl"] == url
    sqs.delete_queue(QueueUrl=url)


def test_list_queues_prefix_and_pagination(sqs: Any) -> None:
    prefix = f"page-{uuid.uuid4().hex[:8]}"
    urls = [sqs.create_queue(QueueName=f"{prefix}-{i}")["QueueUrl"] for i in range(5)]
    first = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2)
    assert len(first["QueueUrls"]) == 2 and first["NextToken"]
    seen = list(first["QueueUrls"])
    token = first["NextToken"]
    while token:
        page = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2, NextToken=token)
        seen += page["QueueUrls"]
        token = page.get("NextToken")
    assert sorted(seen) == sorted(urls)
    # boto3's paginator drives the same tokens.
    pages = sqs.get_paginator("list_queues").paginate(QueueNamePrefix=prefix,
                                                       PaginationConfig={"PageSize": 2})
    assert sorted(u for p in pages for u in p.get("QueueUrls", [])) == sorted(urls)
    assert sorted(sqs.list_queues(QueueNamePrefix=prefix)["QueueUrls"]) == sorted(urls)
    for u in urls:
        sqs.delete_queue(QueueUrl=u)
    # No match: SQS leaves QueueUrls out entirely.
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix=prefix)


def test_attributes_get_set(sqs: Any, new_queue: Any) -> None:
    url = new_queue(VisibilityTimeout="45")
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "45"
    assert attrs["QueueArn"] == f"arn:aws:sqs:us-east-1:000000000000:{url.rsplit('/', 1)[1]}"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "3",
                                                       "VisibilityTimeout": "7"})
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["DelaySeconds",
                                                                "VisibilityTimeout"])
    assert got["Attributes"] == {"DelaySeconds": "3", "VisibilityTimeout": "7"}
    # No names asked: no Attributes member at all.
    assert "Attributes" not in sqs.get_queue_attributes(QueueUrl=url)


def test_tags(sqs: Any, sqs_endpoint: str) -> None:
    name = f"tags-{uuid.uuid4().hex[:8]}"
    url = sqs.create_queue(QueueName=name, tags={"team": "a", "env": "dev"})["QueueUrl"]
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a", "env": "dev"}
    sqs.tag_queue(QueueUrl=url, Tags={"cost": "42"})
    sqs.untag_queue(QueueUrl=url, TagKeys=["team", "env"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"cost": "42"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["cost"])
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)
    sqs.delete_queue(QueueUrl=url)


def test_purge_and_delete(sqs: Any, new_queue: Any) -> None:
    url = new_queue()
    sqs.send_message(QueueUrl=url, MessageBody="x")
    sqs.purge_queue(QueueUrl=url)
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])


def test_dead_letter_source_queues(sqs: Any, new_queue: Any) -> None:
    dlq = new_queue("dlq")
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    policy = f'{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"3"}}'
    sources = sorted(new_queue("src", RedrivePolicy=policy) for _ in range(2))
    assert sorted(sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"]) == sources
    page = sqs.list_dead_letter_source_queues(QueueUrl=dlq, MaxResults=1)
    assert len(page["queueUrls"]) == 1 and page["NextToken"]
    for bad in (0, 1001):
        with pytest.raises(sqs.exceptions.ClientError) as e:
            sqs.list_dead_letter_source_queues(QueueUrl=dlq, MaxResults=bad)
        assert e.value.response["Error"]["Code"] == "InvalidParameterValue"
    # A queue nobody dead-letters into: an empty (present) list.
    assert sqs.list_dead_letter_source_queues(QueueUrl=sources[0])["queueUrls"] == []


def test_modeled_queue_errors(sqs: Any, new_queue: Any) -> None:
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as e:
        sqs.get_queue_url(QueueName=f"missing-{uuid.uuid4().hex[:8]}")
    err = e.value.response
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert err["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert err["Error"]["QueryErrorCode"] == "QueueDoesNotExist"
    assert err["Error"]["Type"] == "Sender"

    url = new_queue(VisibilityTimeout="30")
    name = url.rsplit("/", 1)[1]
    with pytest.raises(sqs.exceptions.QueueNameExists) as e:
        sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "31"})
    assert e.value.response["Error"]["Code"] == "QueueAlreadyExists"

    with pytest.raises(sqs.exceptions.InvalidAttributeName):
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["NoSuchAttribute"])

    with pytest.raises(sqs.exceptions.InvalidAttributeValue):
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "-5"})

    sqs.send_message(QueueUrl=url, MessageBody="x")
    sqs.purge_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.PurgeQueueInProgress) as e:
        sqs.purge_queue(QueueUrl=url)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_queue_deleted_recently(sqs: Any) -> None:
    name = f"recent-{uuid.uuid4().hex[:8]}"
    sqs.delete_queue(QueueUrl=sqs.create_queue(QueueName=name)["QueueUrl"])
    with pytest.raises(sqs.exceptions.QueueDeletedRecently) as e:
        sqs.create_queue(QueueName=name)
    assert e.value.response["Error"]["Code"] == "AWS.SimpleQueueService.QueueDeletedRecently"
