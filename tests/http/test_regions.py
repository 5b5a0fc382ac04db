"""Regions, as in SQS: the region a request is signed for (unsigned: the configured one,
us-east-1 here) is a namespace of its own. The same name in two regions is two queues, each
with its URL and ARN; a URL outside the configured region names its region, and a request
posted to it addresses that queue. Both protocols, through every door."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest

from sqswire import Failed, Wire, signed_query, xml_text

HOME, OTHER = "us-east-1", "eu-west-1"
WireIn = Callable[[str | None], Wire]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _arn(wire: Wire, url: str) -> str:
    return wire("GetQueueAttributes", QueueUrl=url, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]


def _bodies(wire: Wire, url: str) -> list[str]:
    got = wire("ReceiveMessage", QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
    return sorted(m["Body"] for m in got.get("Messages", []))


def test_the_same_name_in_two_regions_is_two_queues(wire_in: WireIn, sqs_endpoint: str) -> None:
    home, other = wire_in(HOME), wire_in(OTHER)
    name = _name("twice")
    home_url = home("CreateQueue", QueueName=name)["QueueUrl"]
    other_url = other("CreateQueue", QueueName=name)["QueueUrl"]
    try:
        assert home_url == f"{sqs_endpoint}/000000000000/{name}"  # as before regions
        assert other_url == f"{sqs_endpoint}/{OTHER}/000000000000/{name}"
        assert _arn(home, home_url) == f"arn:aws:sqs:{HOME}:000000000000:{name}"
        assert _arn(other, other_url) == f"arn:aws:sqs:{OTHER}:000000000000:{name}"
        # Each region sees its own queue, and only that one.
        assert home("GetQueueUrl", QueueName=name)["QueueUrl"] == home_url
        assert other("GetQueueUrl", QueueName=name)["QueueUrl"] == other_url
        assert home("ListQueues", QueueNamePrefix=name)["QueueUrls"] == [home_url]
        assert other("ListQueues", QueueNamePrefix=name)["QueueUrls"] == [other_url]
        only_there = _name("only-there")
        there_url = other("CreateQueue", QueueName=only_there)["QueueUrl"]
        with pytest.raises(Failed) as e:
            home("GetQueueUrl", QueueName=only_there)
        assert e.value.code == "AWS.SimpleQueueService.NonExistentQueue"
        assert "QueueUrls" not in home("ListQueues", QueueNamePrefix=only_there)
        other("DeleteQueue", QueueUrl=there_url)
    finally:
        home("DeleteQueue", QueueUrl=home_url)
        other("DeleteQueue", QueueUrl=other_url)


def test_a_message_sent_in_one_region_is_not_received_in_the_other(wire_in: WireIn) -> None:
    home, other = wire_in(HOME), wire_in(OTHER)
    name = _name("apart")
    home_url = home("CreateQueue", QueueName=name)["QueueUrl"]
    other_url = other("CreateQueue", QueueName=name)["QueueUrl"]
    try:
        other("SendMessage", QueueUrl=other_url, MessageBody="in eu-west-1")
        home("SendMessage", QueueUrl=home_url, MessageBody="in us-east-1")
        assert _bodies(home, home_url) == ["in us-east-1"]
        assert _bodies(other, other_url) == ["in eu-west-1"]
    finally:
        home("DeleteQueue", QueueUrl=home_url)
        other("DeleteQueue", QueueUrl=other_url)


def test_an_unsigned_request_is_in_the_configured_region(wire_in: WireIn,
                                                         sqs_endpoint: str) -> None:
    unsigned, home, other = wire_in(None), wire_in(HOME), wire_in(OTHER)
    name = _name("unsigned")
    url = unsigned("CreateQueue", QueueName=name)["QueueUrl"]
    try:
        assert url == f"{sqs_endpoint}/000000000000/{name}"
        assert home("GetQueueUrl", QueueName=name)["QueueUrl"] == url
        with pytest.raises(Failed) as e:
            other("GetQueueUrl", QueueName=name)
        assert e.value.code == "AWS.SimpleQueueService.NonExistentQueue"
        unsigned("SendMessage", QueueUrl=url, MessageBody="no signature")
        assert _bodies(home, url) == ["no signature"]
    finally:
        home("DeleteQueue", QueueUrl=url)


def test_a_queue_url_naming_its_region_is_the_endpoint_of_query_requests(
        wire_in: WireIn) -> None:
    """Older SDKs post to the queue URL and leave QueueUrl out; the URL names the region,
    which wins over the one the request is signed for."""
    other = wire_in(OTHER)
    name = _name("posted")
    home_url = wire_in(HOME)("CreateQueue", QueueName=name)["QueueUrl"]
    url = other("CreateQueue", QueueName=name)["QueueUrl"]
    try:
        for region in (OTHER, HOME, None):
            status, root = signed_query(url, {"Action": "SendMessage",
                                              "MessageBody": f"posted {region}"}, region=region)
            assert status == 200, xml_text(root, "sqs:Error/sqs:Message")
        status, root = signed_query(url, {"Action": "GetQueueAttributes",
                                          "AttributeName.1": "QueueArn"}, region=OTHER)
        assert status == 200
        assert xml_text(root, ".//sqs:Attribute/sqs:Value") == \
            f"arn:aws:sqs:{OTHER}:000000000000:{name}"
        assert _bodies(other, url) == sorted(f"posted {r}" for r in (OTHER, HOME, None))
        assert _bodies(wire_in(HOME), home_url) == []
    finally:
        other("DeleteQueue", QueueUrl=url)
        wire_in(HOME)("DeleteQueue", QueueUrl=home_url)


def test_a_dead_letter_queue_must_be_in_the_sources_region(wire_in: WireIn) -> None:
    """SQS requires the dead-letter queue in the source's account and region: another
    region's is not there to be one. Within a region, redrive works as ever."""
    home, other = wire_in(HOME), wire_in(OTHER)
    dlq_url = other("CreateQueue", QueueName=_name("dlq"))["QueueUrl"]
    dlq_arn = _arn(other, dlq_url)
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})
    src_url = home("CreateQueue", QueueName=_name("src"))["QueueUrl"]
    eu_src_url = ""
    try:
        for refused in (lambda: home("CreateQueue", QueueName=_name("src"),
                                     Attributes={"RedrivePolicy": policy}),
                        lambda: home("SetQueueAttributes", QueueUrl=src_url,
                                     Attributes={"RedrivePolicy": policy})):
            with pytest.raises(Failed) as e:
                refused()
            assert (e.value.status, e.value.code) == (400, "InvalidParameterValue")
            assert e.value.message.endswith("Reason: Dead-letter target does not exist.")
        eu_src_url = other("CreateQueue", QueueName=_name("src"),
                           Attributes={"RedrivePolicy": policy})["QueueUrl"]
        other("SendMessage", QueueUrl=eu_src_url, MessageBody="poison")
        for _ in range(5):  # maxReceiveCount 1: the second receive moves it
            if not other("ReceiveMessage", QueueUrl=eu_src_url,
                         VisibilityTimeout=0).get("Messages"):
                break
        assert _bodies(other, dlq_url) == ["poison"]
        assert other("ListDeadLetterSourceQueues", QueueUrl=dlq_url)["queueUrls"] == \
            [eu_src_url]
        # Moved back within the region only: a destination in another one is not found.
        with pytest.raises(Failed) as e:
            other("StartMessageMoveTask", SourceArn=dlq_arn,
                  DestinationArn=_arn(home, src_url))
        assert e.value.code == "ResourceNotFoundException"
    finally:
        for w, url in ((home, src_url), (other, eu_src_url), (other, dlq_url)):
            if url:
                w("DeleteQueue", QueueUrl=url)


def test_a_made_up_region_is_refused(sqs_endpoint: str) -> None:
    status, root = signed_query(sqs_endpoint, {"Action": "ListQueues"}, region="no_such")
    assert status == 403
    assert xml_text(root, "sqs:Error/sqs:Code") == "SignatureDoesNotMatch"
    assert "valid region" in (xml_text(root, "sqs:Error/sqs:Message") or "")
