"""The AWS JSON 1.0 protocol: ``X-Amz-Target: AmazonSQS.<Action>``, JSON in, JSON out.

Errors carry the modeled shape in ``__type`` and the query-era code in ``x-amzn-query-error``
(``<code>;Sender``): botocore needs both to raise ``sqs.exceptions.<Shape>`` and report the
familiar ``Error.Code``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from sqsq.errors import ErrorCode
from sqsq.gateway.http.wire import WireError, invalid

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."
# A UTF-16 surrogate written as a JSON escape: the only way a JSON body carries one (raw
# bytes that are not UTF-8 fail to decode), and one alone is not a Unicode character.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def action_of(target: str) -> str | None:
    return target[len(TARGET_PREFIX):] if target.startswith(TARGET_PREFIX) else None


def decode(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise WireError("SerializationException", "SerializationException", 400,
                        "The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise WireError("SerializationException", "SerializationException", 400,
                        "The request body must be a JSON object.")
    if _SURROGATE_ESCAPE.search(body) and _lone_surrogate(data):
        # Refused whole, before anything is routed: a gateway could not even pass it on
        # (protobuf strings are UTF-8).
        raise WireError.of(invalid(
            "Invalid characters found. A lone UTF-16 surrogate (\\ud800-\\udfff) is not a "
            "character. Valid unicode characters are #x9 | #xA | #xD | #x20 to #xD7FF | "
            "#xE000 to #xFFFD | #x10000 to #x10FFFF", ErrorCode.INVALID_MESSAGE_CONTENTS))
    return data


def _lone_surrogate(value: object) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_lone_surrogate(k) or _lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_lone_surrogate(v) for v in value)
    return False


def respond(result: dict[str, Any], request_id: str) -> web.Response:
    return web.Response(body=json.dumps(result, separators=(",", ":")).encode(),
                        content_type=CONTENT_TYPE, headers={"x-amzn-RequestId": request_id})


def respond_error(err: WireError, request_id: str) -> web.Response:
    body = {"__type": f"com.amazonaws.sqs#{err.shape}", "message": err.message}
    return web.Response(
        status=err.status, body=json.dumps(body).encode(), content_type=CONTENT_TYPE,
        headers={"x-amzn-RequestId": request_id,
                 "x-amzn-query-error": f"{err.query_code};{err.fault}"})
