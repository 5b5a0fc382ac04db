"""The query protocol (form-encoded Action=..., XML responses), as older SDKs send it.

Requests are signed with botocore's own SigV4 signer and sent raw (``signed_query``).
"""

from __future__ import annotations

import uuid
from typing import Any


def test_query_protocol_round_trip(sqs_endpoint: str, attributes_md5: Any,
                                   query_client: Any) -> None:
    query, text, NS = query_client
    name = f"query-{uuid.uuid4().hex[:8]}"
    status, root = query(sqs_endpoint, {
        "Action": "CreateQueue", "QueueName": name,
        "Attribute.1.Name": "VisibilityTimeout", "Attribute.1.Value": "40",
        "Tag.1.Key": "team", "Tag.1.Value": "q"})
    assert status == 200 and root.tag == f"{{{NS['sqs']}}}CreateQueueResponse"
    url = text(root, "sqs:CreateQueueResult/sqs:QueueUrl")
    assert url == f"{sqs_endpoint}/000000000000/{name}"
    assert text(root, "sqs:ResponseMetadata/sqs:RequestId")

    _, root = query(sqs_endpoint, {"Action": "SendMessage", "QueueUrl": url,
                                   "MessageBody": "via <query> & xml",
                                   "MessageAttribute.1.Name": "k",
                                   "MessageAttribute.1.Value.DataType": "String",
                                   "MessageAttribute.1.Value.StringValue": "v"})
    want_md5 = attributes_md5({"k": {"DataType": "String", "StringValue": "v"}})
    assert text(root, "sqs:SendMessageResult/sqs:MD5OfMessageAttributes") == want_md5

    # Older SDKs post to the queue URL itself and leave QueueUrl out.
    _, root = query(url, {"Action": "ReceiveMessage", "AttributeName.1": "All",
                          "MessageAttributeName.1": "All", "MaxNumberOfMessages": "5"})
    (msg,) = root.findall("sqs:ReceiveMessageResult/sqs:Message", NS)
    assert text(msg, "sqs:Body") == "via <query> & xml"
    attrs = {text(a, "sqs:Name"): text(a, "sqs:Value") for a in msg.findall("sqs:Attribute", NS)}
    assert attrs["ApproximateReceiveCount"] == "1"
    (mattr,) = msg.findall("sqs:MessageAttribute", NS)
    assert text(mattr, "sqs:Name") == "k" and text(mattr, "sqs:Value/sqs:StringValue") == "v"

    _, root = query(sqs_endpoint, {
        "Action": "DeleteMessageBatch", "QueueUrl": url,
        "DeleteMessageBatchRequestEntry.1.Id": "ok",
        "DeleteMessageBatchRequestEntry.1.ReceiptHandle": text(msg, "sqs:ReceiptHandle"),
        "DeleteMessageBatchRequestEntry.2.Id": "bad",
        "DeleteMessageBatchRequestEntry.2.ReceiptHandle": "forged"})
    result = root.find("sqs:DeleteMessageBatchResult", NS)
    assert text(result, "sqs:DeleteMessageBatchResultEntry/sqs:Id") == "ok"
    assert text(result, "sqs:BatchResultErrorEntry/sqs:Id") == "bad"
    assert text(result, "sqs:BatchResultErrorEntry/sqs:SenderFault") == "true"

    _, root = query(sqs_endpoint, {"Action": "ListQueueTags", "QueueUrl": url})
    assert text(root, "sqs:ListQueueTagsResult/sqs:Tag/sqs:Key") == "team"
    status, root = query(sqs_endpoint, {"Action": "DeleteQueue", "QueueUrl": url})
    assert status == 200 and root.tag == f"{{{NS['sqs']}}}DeleteQueueResponse"


def test_query_protocol_errors(sqs_endpoint: str, query_client: Any) -> None:
    query, text, NS = query_client
    status, root = query(sqs_endpoint, {"Action": "GetQueueUrl", "QueueName": "nope-nope"})
    assert status == 400 and root.tag == f"{{{NS['sqs']}}}ErrorResponse"
    assert text(root, "sqs:Error/sqs:Code") == "AWS.SimpleQueueService.NonExistentQueue"
    assert text(root, "sqs:Error/sqs:Type") == "Sender"
    assert text(root, "sqs:RequestId")
    status, root = query(sqs_endpoint, {"Action": "FlyToTheMoon"})
    assert status == 400 and text(root, "sqs:Error/sqs:Code") == "InvalidAction"
    status, root = query(sqs_endpoint, {"Action": "SendMessage"})
    assert status == 400 and text(root, "sqs:Error/sqs:Code") == "MissingParameter"
