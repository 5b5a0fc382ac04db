"""Two answers an outside conformance run found different from Amazon SQS's:

- ``MessageAttributeNames=["Hel.*"]`` selects every message attribute whose name starts with
  ``Hel`` (``Hello`` and ``Help.Me``, not only names starting ``Hel.``), and
  ``MD5OfMessageAttributes`` is the digest of what is returned;
- the query protocol asked for JSON (``Accept: application/json``) names the received
  messages ``ReceiveMessageResult.messages`` (and ListQueues' ``queueUrls``), lower case.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from sqsq.client import Client
from sqswire import Wire

ATTRIBUTES = {name: {"DataType": "String", "StringValue": value} for name, value in
              (("Help.Me", "Me"), ("Hello", "There"), ("General", "Kenobi"))}


def _selected(names: list[str]) -> dict[str, Any]:
    return {k: v for k, v in ATTRIBUTES.items() if k in names}


def test_a_prefix_wildcard_selects_every_attribute_starting_with_it(
        wire: Wire, sqs: Any, new_queue: Callable[..., str],
        attributes_md5: Callable[[dict[str, Any]], str]) -> None:
    url = new_queue()
    wire("SendMessage", QueueUrl=url, MessageBody="msg", MessageAttributes=ATTRIBUTES)
    for asked, expected in ((["Hel.*"], ["Hello", "Help.Me"]), (["Help.*"], ["Help.Me"]),
                            (["Help.Me.*"], ["Help.Me"]), (["Foo.*"], []),
                            (["Gen.*", "Hello"], ["General", "Hello"]),
                            ([".*"], list(ATTRIBUTES))):
        (m,) = wire("ReceiveMessage", QueueUrl=url, VisibilityTimeout=0,
                    MessageAttributeNames=asked)["Messages"]
        assert sorted(m.get("MessageAttributes", {})) == sorted(expected), asked
        if expected:
            assert m["MD5OfMessageAttributes"] == attributes_md5(_selected(expected)), asked
        else:
            assert "MD5OfMessageAttributes" not in m
    # boto3 checks MD5OfMessageAttributes against what it received itself
    (m,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0,
                               MessageAttributeNames=["Hel.*"])["Messages"]
    assert sorted(m["MessageAttributes"]) == ["Hello", "Help.Me"]


def test_the_sdk_selects_by_prefix_too(server: Any,
                                       attributes_md5: Callable[[dict[str, Any]], str]) -> None:
    with Client(server.endpoint, timeout=30) as c:
        url = c.create_queue("prefix-sdk")
        c.send_message(url, "msg", message_attributes=ATTRIBUTES)
        (m,) = c.receive_message(url, visibility_timeout=0, message_attribute_names=["Hel.*"])
        assert sorted(m.message_attributes) == ["Hello", "Help.Me"]
        assert m.md5_of_message_attributes == attributes_md5(_selected(["Hello", "Help.Me"]))
        c.delete_queue(url)


def _query_json(endpoint: str, params: dict[str, str]) -> dict[str, Any]:
    req = urllib.request.Request(endpoint, data=urlencode(params).encode(), method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded",
                                          "Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_the_query_protocol_as_json_names_lists_as_sqs_does(
        sqs_endpoint: str, new_queue: Callable[..., str]) -> None:
    url = new_queue("qjson")
    _query_json(url, {"Action": "SendMessage", "MessageBody": "hello"})
    doc = _query_json(url, {"Action": "ReceiveMessage", "VisibilityTimeout": "0"})
    result = doc["ReceiveMessageResponse"]["ReceiveMessageResult"]
    assert list(result) == ["messages"]
    assert [m["Body"] for m in result["messages"]] == ["hello"]
    doc = _query_json(sqs_endpoint, {"Action": "ListQueues",
                                     "QueueNamePrefix": url.rsplit("/", 1)[1]})
    assert doc["ListQueuesResponse"]["ListQueuesResult"]["queueUrls"] == [url]
