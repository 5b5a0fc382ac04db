"""One call, either protocol: a test runs once over JSON (boto3) and once over the query
protocol (signed form in, XML out), with parameters and results in the JSON shape."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import urlencode

import botocore
import botocore.exceptions
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

NS = {"sqs": "http://queue.amazonaws.com/doc/2012-11-05/"}


def signed_query(url: str, params: dict[str, str], key: str = "x", secret: str = "y",
                 headers: dict[str, str] | None = None,
                 region: str | None = "us-east-1") -> tuple[int, ET.Element]:
    """POST a query-protocol form to ``url``, signed for ``region`` (None: unsigned)."""
    body = urlencode({"Version": "2012-11-05", **params}).encode()
    req = AWSRequest(method="POST", url=url, data=body, headers={
        "Content-Type": "application/x-www-form-urlencoded; charset=utf-8", **(headers or {})})
    if region is not None:
        SigV4Auth(Credentials(key, secret), "sqs", region).add_auth(req)
    prepared = req.prepare()
    raw = urllib.request.Request(prepared.url, data=prepared.body, method="POST",
                                 headers=dict(prepared.headers.items()))
    try:
        with urllib.request.urlopen(raw, timeout=30) as resp:
            return resp.status, ET.fromstring(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, ET.fromstring(e.read())


def xml_text(root: ET.Element, path: str) -> str | None:
    node = root.find(path, NS)
    return None if node is None else node.text


class Failed(Exception):
    """An SQS error as the caller saw it: HTTP status, ``Error.Code``, message and (JSON
    protocol) the ``__type`` shape name."""

    def __init__(self, status: int, code: str, message: str, shape: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.shape = status, code, message, shape


_QUERY_MAPS = {"Attributes": ("Attribute", "Name", "Value"), "Tags": ("Tag", "Key", "Value"),
               "tags": ("Tag", "Key", "Value"),
               "MessageAttributes": ("MessageAttribute", "Name", "Value"),
               "MessageSystemAttributes": ("MessageSystemAttribute", "Name", "Value")}
_QUERY_LISTS = {"AttributeNames": "AttributeName", "MessageAttributeNames": "MessageAttributeName",
                "MessageSystemAttributeNames": "MessageSystemAttributeName",
                "TagKeys": "TagKey", "AWSAccountIds": "AWSAccountId", "Actions": "ActionName"}
_XML_MAPS = {"Attribute": ("Attributes", "Name"), "MessageAttribute": ("MessageAttributes", "Name"),
             "Tag": ("Tags", "Key")}


def query_form(action: str, params: dict[str, Any]) -> dict[str, str]:
    """JSON-shaped parameters -> the query protocol's flattened form."""
    form: dict[str, str] = {"Action": action}

    def put(prefix: str, value: Any) -> None:
        if isinstance(value, bool):
            form[prefix] = "true" if value else "false"
        elif isinstance(value, bytes):
            form[prefix] = base64.b64encode(value).decode()
        elif isinstance(value, dict):
            for k, v in value.items():
                put(f"{prefix}.{k}", v)
        else:
            form[prefix] = str(value)

    for name, value in params.items():
        if name in _QUERY_MAPS:
            element, key, val = _QUERY_MAPS[name]
            for i, (k, v) in enumerate(value.items(), 1):
                form[f"{element}.{i}.{key}"] = k
                put(f"{element}.{i}.{val}", v)
        elif name in _QUERY_LISTS:
            for i, v in enumerate(value, 1):
                form[f"{_QUERY_LISTS[name]}.{i}"] = v
        elif name == "Entries":
            for i, entry in enumerate(value, 1):
                for k, v in query_form(action, entry).items():
                    if k != "Action":
                        form[f"{action}RequestEntry.{i}.{k}"] = v
        else:
            put(name, value)
    return form


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def query_result(action: str, node: ET.Element) -> Any:
    """An XML result element -> the JSON shape (every scalar a string)."""
    children = list(node)
    if not children:
        return node.text or ""
    out: dict[str, Any] = {}
    for child in children:
        tag = _local(child.tag)
        if tag in _XML_MAPS:
            member, key = _XML_MAPS[tag]
            k = xml_text(child, f"sqs:{key}")
            out.setdefault(member, {})[k] = query_result(action, child.find("sqs:Value", NS))
        elif tag == "QueueUrl" and action in ("ListQueues", "ListDeadLetterSourceQueues"):
            member = "QueueUrls" if action == "ListQueues" else "queueUrls"
            out.setdefault(member, []).append(child.text)
        elif tag in ("Message", "BatchResultErrorEntry") or tag.endswith("ResultEntry"):
            member = {"Message": "Messages", "BatchResultErrorEntry": "Failed",
                      "ListMessageMoveTasksResultEntry": "Results"}.get(tag, "Successful")
            out.setdefault(member, []).append(query_result(action, child))
        else:
            out[tag] = query_result(action, child)
    return out


class Wire:
    """``wire("SendMessage", QueueUrl=..., MessageBody=...)`` -> the result as a dict, or
    raises ``Failed``. ``protocol`` is "json" (boto3) or "query" (signed form, XML);
    ``region`` is the one requests are signed for (None: unsigned), which ``sqs`` must be
    made for too."""

    def __init__(self, protocol: str, endpoint: str, sqs: Any,
                 region: str | None = "us-east-1") -> None:
        self.protocol, self.endpoint, self.sqs, self.region = protocol, endpoint, sqs, region

    def __call__(self, action: str, headers: dict[str, str] | None = None,
                 **params: Any) -> dict[str, Any]:
        if self.protocol == "json":
            method = getattr(self.sqs, botocore.xform_name(action))

            def add_headers(request: Any, **_: Any) -> None:
                for k, v in (headers or {}).items():
                    request.headers[k] = v

            event = f"before-sign.sqs.{action}"
            self.sqs.meta.events.register(event, add_headers, unique_id="wire-headers")
            try:
                result = method(**params)
            except botocore.exceptions.ClientError as e:
                err = e.response["Error"]
                raise Failed(e.response["ResponseMetadata"]["HTTPStatusCode"], err["Code"],
                             err.get("Message", ""), err.get("QueryErrorCode")) from None
            finally:
                self.sqs.meta.events.unregister(event, unique_id="wire-headers")
            result.pop("ResponseMetadata", None)
            return result
        status, root = signed_query(self.endpoint, query_form(action, params), headers=headers,
                                    region=self.region)
        if status != 200:
            raise Failed(status, xml_text(root, "sqs:Error/sqs:Code") or "",
                         xml_text(root, "sqs:Error/sqs:Message") or "")
        node = root.find(f"sqs:{action}Result", NS)
        result = None if node is None else query_result(action, node)
        return result if isinstance(result, dict) else {}  # <XResult/>: nothing to say


