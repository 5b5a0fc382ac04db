"""The query protocol: form-encoded ``Action=...`` in, XML out (what older SDKs speak).

The form's flattened names (``Attribute.1.Name``, ``SendMessageBatchRequestEntry.2.Id``,
``MessageAttribute.1.Value.DataType``) are decoded into the JSON protocol's shape, so one
handler serves both protocols; results are encoded back with SQS's XML element names.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from typing import Any
from xml.sax.saxutils import escape

from aiohttp import web

from sqsq.gateway.http.wire import WireError

NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"

# form list name -> JSON member name (each ``Name.N`` is one item)
_LISTS = {
    "AttributeName": "AttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "TagKey": "TagKeys",
    "StringListValue": "StringListValues",
    "BinaryListValue": "BinaryListValues",
    "AWSAccountId": "AWSAccountIds",
    "ActionName": "Actions",
}
# form map name -> (JSON member name, key field, value field)
_MAPS = {
    "Attribute": ("Attributes", "Name", "Value"),
    "MessageAttribute": ("MessageAttributes", "Name", "Value"),
    "MessageSystemAttribute": ("MessageSystemAttributes", "Name", "Value"),
    "Tag": ("Tags", "Key", "Value"),
}
_ENTRY_RE = re.compile(r"\w+RequestEntry")
# JSON list member -> XML element per item (Successful depends on the action)
_ITEMS = {
    "QueueUrls": "QueueUrl",
    "queueUrls": "QueueUrl",
    "Messages": "Message",
    "Failed": "BatchResultErrorEntry",
    "Results": "ListMessageMoveTasksResultEntry",
}
_XML_MAPS = {v[0]: (k, v[1], v[2]) for k, v in _MAPS.items()}
# JSON list member -> its name in a query response asked for as JSON
_JSON_LISTS = {"Messages": "messages", "QueueUrls": "queueUrls"}


def _tree(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for key, value in pairs:
        node = root
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):  # "A=1&A.1=2": the scalar loses
                child = node[part] = {}
            node = child
        node.setdefault(parts[-1], value)
    return root


def _indexed(node: Any) -> list[Any]:
    if not isinstance(node, dict):
        return [node]
    items = [(int(k), v) for k, v in node.items() if k.isdigit()]
    return [v for _, v in sorted(items)]


def _convert(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _LISTS:
            out[_LISTS[key]] = [v for v in _indexed(value) if isinstance(v, str)]
        elif key in _MAPS:
            name, k_field, v_field = _MAPS[key]
            mapping: dict[str, Any] = {}
            for item in _indexed(value):
                if isinstance(item, dict) and isinstance(item.get(k_field), str):
                    v = item.get(v_field)
                    mapping[item[k_field]] = _convert(v) if isinstance(v, dict) else v
            out[name] = mapping
        elif _ENTRY_RE.fullmatch(key):
            out["Entries"] = [_convert(v) for v in _indexed(value) if isinstance(v, dict)]
        else:
            out[key] = _convert(value) if isinstance(value, dict) else value
    return out


def decode(pairs: Iterable[tuple[str, str]]) -> tuple[str, dict[str, Any]]:
    """(action, parameters in the JSON shape) from the query string and form pairs."""
    data = _convert(_tree(pairs))
    action = data.pop("Action", "")
    data.pop("Version", None)
    return (action if isinstance(action, str) else ""), data


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    # CR would be normalized away by XML parsers: send it as a character reference, as SQS does.
    return escape(str(value), {"\r": "&#xD;"})


def _xml(name: str, value: Any, action: str, out: list[str]) -> None:
    if isinstance(value, dict) and name in _XML_MAPS:
        element, k_field, v_field = _XML_MAPS[name]
        for k, v in value.items():
            out.append(f"<{element}><{k_field}>{_scalar(k)}</{k_field}>")
            _xml(v_field, v, action, out)
            out.append(f"</{element}>")
    elif isinstance(value, list):
        item = f"{action}ResultEntry" if name == "Successful" else _ITEMS.get(name, name)
        for v in value:
            _xml(item, v, action, out)
    elif isinstance(value, dict):
        out.append(f"<{name}>")
        for k, v in value.items():
            _xml(k, v, action, out)
        out.append(f"</{name}>")
    else:
        out.append(f"<{name}>{_scalar(value)}</{name}>")


def respond(action: str, result: dict[str, Any], request_id: str,
            as_json: bool = False) -> web.Response:
    if as_json:  # ``Accept: application/json``: the same document, as JSON
        # ...whose lists SQS names in lower camel case: ReceiveMessageResult.messages,
        # ListQueuesResult.queueUrls
        result = {_JSON_LISTS.get(k, k): v for k, v in (result or {}).items()}
        body = {f"{action}Response": {f"{action}Result": result or None,
                                      "ResponseMetadata": {"RequestId": request_id}}}
        return web.json_response(body, headers={"x-amzn-RequestId": request_id})
    parts = [f'<?xml version="1.0"?><{action}Response xmlns="{NAMESPACE}">']
    if result:
        _xml(f"{action}Result", result, action, parts)
    elif action in _RESULTLESS:
        pass
    else:
        parts.append(f"<{action}Result/>")
    parts.append(f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata>"
                 f"</{action}Response>")
    return web.Response(text="".join(parts), content_type="text/xml",
                        headers={"x-amzn-RequestId": request_id})


# Actions whose query response has no <Result> element at all.
_RESULTLESS = frozenset({
    "DeleteQueue", "PurgeQueue", "SetQueueAttributes", "TagQueue", "UntagQueue",
    "DeleteMessage", "ChangeMessageVisibility", "AddPermission", "RemovePermission",
})


# The query protocol's wording for a missing queue (the JSON protocol's is shorter).
_QUERY_MESSAGES = {
    "AWS.SimpleQueueService.NonExistentQueue":
        "The specified queue does not exist for this wsdl version.",
}


def unknown_operation(request_id: str) -> web.Response:
    """A request to a queue URL that names no action, as SQS answers it."""
    return web.Response(status=404, text="<UnknownOperationException/>", content_type="text/xml",
                        headers={"x-amzn-RequestId": request_id})


def respond_error(err: WireError, request_id: str, as_json: bool = False) -> web.Response:
    message = _QUERY_MESSAGES.get(err.query_code, err.message)
    if as_json:
        body = {"Error": {"Type": err.fault, "Code": err.query_code, "Message": message},
                "RequestId": request_id}
        return web.json_response(body, status=err.status,
                                 headers={"x-amzn-RequestId": request_id})
    body = (f'<?xml version="1.0"?><ErrorResponse xmlns="{NAMESPACE}"><Error>'
            f"<Type>{err.fault}</Type><Code>{escape(err.query_code)}</Code>"
            f"<Message>{escape(message)}</Message><Detail/></Error>"
            f"<RequestId>{request_id}</RequestId></ErrorResponse>")
    return web.Response(status=err.status, text=body, content_type="text/xml",
                        headers={"x-amzn-RequestId": request_id})
