"""The SQS-compatible HTTP front: one aiohttp route, two wire protocols, one set of handlers.

A request is authenticated (SigV4, unless the server runs open), decoded by its protocol
(``X-Amz-Target`` means AWS JSON 1.0, anything else the query protocol), handed to the action's
handler over ``QueueService``, and the result or error is encoded back by the same protocol.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from urllib.parse import parse_qsl

from aiohttp import web

from sqsq.api import QueueService
from sqsq.errors import ErrorCode, QueueError
from sqsq.gateway import logs
from sqsq.gateway.auth import Authenticator, AuthError, SignedRequest, signing_region
from sqsq.gateway.console import ConsoleSource
from sqsq.gateway.console import install as install_console
from sqsq.gateway.http import json_protocol, query_protocol, quietlog
from sqsq.gateway.http.actions import ACTIONS, UNSUPPORTED
from sqsq.gateway.http.wire import Params, WireError, invalid
from sqsq.gateway.metrics import ApiMetrics, RequestOutcome

log = logging.getLogger("sqsq.http")

# A batch of 10 messages at SQS's 1 MiB total, base64 and form-encoding overhead included.
MAX_BODY = 4 * 1024 * 1024
# A client that declares a body must send it within this long.
BODY_READ_TIMEOUT_S = 30.0
_TOO_LARGE = (f"The request is larger than {MAX_BODY} bytes. Reason: Message must be shorter "
              "than 1048576 bytes.")


async def _read_body(request: web.Request) -> bytes:
    """The body, bounded in size and in time: over-size is an SQS error, not aiohttp's
    plain-text 413; a body that never comes is a 408, not a connection held forever."""
    if (request.content_length or 0) > MAX_BODY:
        raise invalid(_TOO_LARGE)
    try:
        return await asyncio.wait_for(request.read(), BODY_READ_TIMEOUT_S)
    except web.HTTPRequestEntityTooLarge:
        raise invalid(_TOO_LARGE) from None
    except TimeoutError:
        raise WireError("RequestTimeout", "RequestTimeout", 408,
                        f"The request body did not arrive within {BODY_READ_TIMEOUT_S:g} s.",
                        ) from None


def _signed(request: web.Request, body: bytes) -> SignedRequest:
    return SignedRequest(
        method=request.method, raw_path=request.rel_url.raw_path,
        raw_query=request.rel_url.raw_query_string,
        headers=lambda name: request.headers.getall(name, []), body=body)


def _query_pairs(request: web.Request, body: bytes) -> list[tuple[str, str]]:
    pairs = parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True)
    if body and request.content_type in ("application/x-www-form-urlencoded", ""):
        try:
            pairs += parse_qsl(body.decode("utf-8"), keep_blank_values=True,
                               strict_parsing=False)
        except UnicodeDecodeError:
            raise invalid("The request body is not valid UTF-8.") from None
    return pairs


# Actions of the service endpoint: sent to a queue URL they are InvalidAction, as in SQS.
_SERVICE_ONLY = frozenset({"CreateQueue", "ListQueues"})


def _wants_json(request: web.Request) -> bool:
    """A query-protocol caller may ask for JSON (``Accept: application/json``), as SQS lets."""
    return "application/json" in request.headers.get("Accept", "")


def _trace_header_from(request: web.Request, data: dict) -> None:
    """SQS takes SendMessage's ``X-Amzn-Trace-Id`` header as the AWSTraceHeader system
    attribute, unless the request names one itself."""
    trace = request.headers.get("X-Amzn-Trace-Id")
    system = data.get("MessageSystemAttributes")
    if trace and (system is None or isinstance(system, dict)) and \
            "AWSTraceHeader" not in (system or {}):
        data["MessageSystemAttributes"] = {
            **(system or {}), "AWSTraceHeader": {"DataType": "String", "StringValue": trace}}


def _path_queue_url(request: web.Request) -> str | None:
    # Older SDKs post to the queue URL itself ([/REGION]/ACCOUNT/NAME), leaving QueueUrl out.
    path = request.path.rstrip("/")
    return path if path.count("/") >= 2 else None


def _queue_named(data: object, queue_path: str | None) -> str:
    """The queue a request is about, for its log lines: the last part of its URL or name."""
    named = data.get("QueueUrl") or data.get("QueueName") if isinstance(data, dict) else None
    named = named if isinstance(named, str) else queue_path or ""
    return named.rstrip("/").rsplit("/", 1)[-1][:80]


class HttpFront:
    def __init__(self, api: QueueService, auth: Authenticator,
                 metrics: ApiMetrics | None = None) -> None:
        self.api = api
        self.auth = auth
        self.metrics = metrics

    async def handle(self, request: web.Request) -> web.StreamResponse:
        request_id = str(uuid.uuid4())
        token = logs.bind(request_id, "")
        try:
            if self.metrics is None:
                return await self._handle(request, request_id, RequestOutcome(""))
            with self.metrics.request("", "http") as outcome:
                return await self._handle(request, request_id, outcome)
        finally:
            logs.unbind(token)

    async def _handle(self, request: web.Request, request_id: str,
                      outcome: RequestOutcome) -> web.StreamResponse:
        target = request.headers.get("X-Amz-Target")
        action = ""
        try:
            body = await _read_body(request)
            signed = _signed(request, body)
            self.auth.verify_sigv4(signed)
            region = signing_region(signed)  # unsigned: the configured region
            queue_path = _path_queue_url(request)
            if target is not None:
                action = json_protocol.action_of(target) or target
                data = json_protocol.decode(body)
            else:
                action, data = query_protocol.decode(_query_pairs(request, body))
                if queue_path and not action:
                    return query_protocol.unknown_operation(request_id)
                if queue_path and action in _SERVICE_ONLY:
                    raise invalid(f"The action {action} is not valid for this endpoint.",
                                  ErrorCode.INVALID_ACTION)
            outcome.action = action
            logs.bind(request_id, action[:40], _queue_named(data, queue_path))
            handler = ACTIONS.get(action)
            if handler is None:
                raise self._unknown_action(action)
            if action == "SendMessage":
                _trace_header_from(request, data)
            result = await handler(self.api,
                                   Params(data, queue_path, self.api.endpoint, region))
        except QueueError as e:
            return self._error(request, target, WireError.of(e), request_id, outcome)
        except AuthError as e:
            return self._error(request, target,
                               WireError(e.code, e.code, e.http_status, e.message), request_id,
                               outcome)
        except WireError as e:
            return self._error(request, target, e, request_id, outcome)
        except web.HTTPException:
            raise
        except ConnectionError as e:  # the client hung up: one line, not a traceback
            log.info("client %s went away during %s: %s", request.remote, action or "request",
                     type(e).__name__, extra={"mishap": True, "mishap_kind": type(e).__name__})
            return web.Response(status=400)
        except Exception as e:  # noqa: BLE001 - every failure leaves as an SQS error
            log.exception("internal error in %s", action or "request")
            return self._error(request, target, WireError(
                "InternalError", "InternalError", 500, f"internal error: {e}", False), request_id,
                outcome)
        if target is not None:
            return json_protocol.respond(result, request_id)
        return query_protocol.respond(action, result, request_id, _wants_json(request))

    @staticmethod
    def _unknown_action(action: str) -> QueueError:
        if action in UNSUPPORTED:
            return invalid(f"The action {action} is not supported by sqsq.",
                           ErrorCode.UNSUPPORTED_OPERATION)
        return invalid(f"The action {action or '(none)'} is not valid for this endpoint.",
                       ErrorCode.INVALID_ACTION)

    @staticmethod
    def _error(request: web.Request, target: str | None, err: WireError,
               request_id: str, outcome: RequestOutcome) -> web.Response:
        outcome.code = err.code
        log.debug("request %s failed: %s %s", request_id, err.code, err.message)
        if target is not None:
            return json_protocol.respond_error(err, request_id)
        return query_protocol.respond_error(err, request_id, _wants_json(request))


def make_app(api: QueueService, auth: Authenticator,
             metrics: ApiMetrics | None = None,
             console: ConsoleSource | None = None) -> web.Application:
    quietlog.install("aiohttp.server", "sqsq.http")
    app = web.Application(client_max_size=MAX_BODY)
    if console is not None:  # /console first: the SQS route below takes every path
        install_console(app, console, auth)
    app.router.add_route("*", "/{tail:.*}", HttpFront(api, auth, metrics).handle)
    return app
