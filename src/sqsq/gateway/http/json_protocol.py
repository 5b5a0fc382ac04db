"""The AWS JSON 1.0 protocol: ``X-Amz-Target: AmazonSQS.<Action>``, JSON in, JSON out.

Errors carry the modeled shape in ``__type`` and the query-era code in ``x-amzn-query-error``
(``<code>;Sender``): botocore needs both to raise ``sqs.exceptions.<Shape>`` and report the
familiar ``Error.Code``.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from sqsq.gateway.http.wire import WireError

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."


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
    return data


def respond(result: dict[str, Any], request_id: str) -> web.Response:
    return web.Response(body=json.dumps(result, separators=(",", ":")).encode(),
                        content_type=CONTENT_TYPE, headers={"x-amzn-RequestId": request_id})


def respond_error(err: WireError, request_id: str) -> web.Response:
    body = {"__type": f"com.amazonaws.sqs#{err.shape}", "message": err.message}
    return web.Response(
        status=err.status, body=json.dumps(body).encode(), content_type=CONTENT_TYPE,
        headers={"x-amzn-RequestId": request_id,
                 "x-amzn-query-error": f"{err.query_code};{err.fault}"})
