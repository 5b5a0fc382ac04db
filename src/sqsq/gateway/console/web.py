"""The console's pages: aiohttp handlers rendering Jinja2 templates (autoescaped: queue names,
attributes and message bodies are text, never markup), no JavaScript, no assets to fetch.

Who may do what:
- no credentials configured (an open server): anyone may look; nothing can be changed (the
  purge and redrive buttons are not shown and their POSTs are refused, 403);
- credentials configured: every page asks for one of them (HTTP basic auth: access key id as
  the user, secret as the password; the pages show message bodies, which the API itself
  only gives to a signed caller), and with them purge and redrive work. Each is a confirm
  page, then a POST carrying a token derived from the caller's secret (HMAC of the action
  and queue), so another site cannot make a signed-in browser post one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import jinja2
from aiohttp import web

from sqsq.core.peek import PEEK_MAX_MESSAGES
from sqsq.errors import ErrorCode, QueueError
from sqsq.gateway.auth import Authenticator
from sqsq.gateway.console.chart import depth_chart
from sqsq.gateway.console.sampler import HISTORY_S, DepthHistory
from sqsq.gateway.console.sources import MAX_SAMPLED_QUEUES, ConsoleSource

ROOT = "/console"
ACTIONS = ("purge", "redrive")
MAX_LISTED_QUEUES = MAX_SAMPLED_QUEUES
LIST_CONCURRENCY = 8
REALM = 'Basic realm="sqsq console", charset="UTF-8"'

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d"


def _utc(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


_env.filters.update(age=_age, utc=_utc, q=lambda s: quote(str(s), safe=""))


@dataclass(frozen=True)
class Viewer:
    key_id: str | None  # None: an open server's anonymous viewer
    secret: str | None

    @property
    def may_change(self) -> bool:
        return self.key_id is not None

    def token(self, action: str, queue: str) -> str:
        assert self.secret is not None and self.key_id is not None
        message = f"sqsq-console\n{self.key_id}\n{action}\n{queue}".encode()
        return hmac.new(self.secret.encode(), message, hashlib.sha256).hexdigest()


@dataclass
class QueueRow:
    key: str
    visible: int
    in_flight: int
    delayed: int
    oldest_age_s: float | None
    dead_letter_queue: str | None
    max_receive_count: str
    fifo: bool


def _page(template: str, status: int = 200, **values: object) -> web.Response:
    html = _env.get_template(template).render(root=ROOT, **values)
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-store",
                                 "Content-Security-Policy": "default-src 'none'; "
                                 "style-src 'unsafe-inline'; img-src data:; form-action 'self'",
                                 "X-Frame-Options": "DENY"})


class Console:
    def __init__(self, source: ConsoleSource, auth: Authenticator,
                 history: DepthHistory) -> None:
        self.source = source
        self.api = source.api
        self.auth = auth
        self.history = history

    # ---- who is asking ----
    def viewer(self, request: web.Request) -> Viewer:
        if self.auth.open:
            return Viewer(None, None)
        header = request.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() == "basic":
            try:
                key_id, _, secret = base64.b64decode(encoded.strip(), validate=True) \
                    .decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                key_id = secret = ""
            known = self.auth.credentials.get(key_id)
            if known is not None and hmac.compare_digest(known.encode(), secret.encode()):
                return Viewer(key_id, secret)
        raise web.HTTPUnauthorized(
            headers={"WWW-Authenticate": REALM},
            text="This console needs one of the server's access keys: the access key id as "
                 "the user name, the secret access key as the password.\n")

    # ---- pages ----
    async def index(self, request: web.Request) -> web.Response:
        viewer = self.viewer(request)
        try:
            urls, more = await self.api.list_queues("", MAX_LISTED_QUEUES)
        except QueueError as e:
            return self._error(e, viewer)
        keys = [self.api.endpoint.queue_key(u) for u in urls]
        gate = asyncio.Semaphore(LIST_CONCURRENCY)

        async def row(key: str) -> QueueRow | None:
            async with gate:
                try:
                    attrs = await self.api.get_queue_attributes(key, ["All"])
                    oldest = await self.source.peek(key, 0)
                except QueueError:
                    return None  # deleted since the listing
            age = None if oldest.oldest_sent_ms is None else \
                (oldest.now_ms - oldest.oldest_sent_ms) / 1000
            dlq, max_receives = self._redrive(attrs)
            return QueueRow(key, int(attrs.get("ApproximateNumberOfMessages", 0)),
                            int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0)),
                            int(attrs.get("ApproximateNumberOfMessagesDelayed", 0)),
                            age, dlq, max_receives, attrs.get("FifoQueue") == "true")

        rows = [r for r in await asyncio.gather(*(row(k) for k in keys)) if r is not None]
        return _page("index.html", viewer=viewer, queues=rows, truncated=bool(more),
                     shards=self.source.shard_map(), endpoint=self.api.endpoint.base_url)

    def _redrive(self, attrs: Mapping[str, str]) -> tuple[str | None, str]:
        """(the dead-letter queue's key, maxReceiveCount) of a queue's RedrivePolicy."""
        try:
            policy = json.loads(attrs.get("RedrivePolicy") or "{}")
            arn = str(policy["deadLetterTargetArn"])
        except (ValueError, KeyError, TypeError):
            return None, ""
        return self.api.endpoint.key_of_arn(arn) or arn, str(policy.get("maxReceiveCount", ""))

    async def queue(self, request: web.Request) -> web.Response:
        viewer = self.viewer(request)
        name = request.match_info["name"]
        try:
            attrs = await self.api.get_queue_attributes(name, ["All"])
            peeked = await self.source.peek(name, PEEK_MAX_MESSAGES)
            sources = await self.api.list_dead_letter_source_queues(name)
            tasks = await self._tasks(attrs["QueueArn"]) if sources else []
        except QueueError as e:
            return self._error(e, viewer)
        now_s = time.time()
        chart = depth_chart(self.history.samples(name, now_s - HISTORY_S), now_s)
        dlq, max_receives = self._redrive(attrs)
        age = None if peeked.oldest_sent_ms is None else \
            (peeked.now_ms - peeked.oldest_sent_ms) / 1000
        return _page(
            "queue.html", viewer=viewer, name=name, attrs=sorted(attrs.items()),
            visible=attrs.get("ApproximateNumberOfMessages", "0"),
            in_flight=attrs.get("ApproximateNumberOfMessagesNotVisible", "0"),
            delayed=attrs.get("ApproximateNumberOfMessagesDelayed", "0"),
            oldest_age_s=age, peek=peeked, chart=chart,
            interval_s=self.history.interval_s, dead_letter_queue=dlq,
            max_receive_count=max_receives,
            sources=[self.api.endpoint.queue_key(u) for u in sources], tasks=tasks,
            done=request.query.get("done", ""))

    async def _tasks(self, arn: str) -> list[dict]:
        try:
            return await self.api.list_message_move_tasks(arn, 10)
        except QueueError:
            return []

    async def confirm(self, request: web.Request) -> web.Response:
        viewer = self.viewer(request)
        name, action = request.match_info["name"], request.match_info["action"]
        if not viewer.may_change:
            return self._read_only(viewer)
        try:
            attrs = await self.api.get_queue_attributes(name, ["ApproximateNumberOfMessages"])
        except QueueError as e:
            return self._error(e, viewer)
        return _page("confirm.html", viewer=viewer, name=name, action=action,
                     visible=attrs.get("ApproximateNumberOfMessages", "0"),
                     token=viewer.token(action, name))

    async def act(self, request: web.Request) -> web.Response:
        viewer = self.viewer(request)
        name, action = request.match_info["name"], request.match_info["action"]
        if not viewer.may_change:
            return self._read_only(viewer)
        form = await request.post()
        if not hmac.compare_digest(str(form.get("token", "")), viewer.token(action, name)):
            return _page("error.html", 403, viewer=viewer, code="Forbidden",
                         message="The confirmation token is missing or wrong: start again "
                                 "from the queue's page.")
        try:
            if action == "purge":
                await self.api.purge_queue(name)
            else:
                arn = (await self.api.get_queue_attributes(name, ["QueueArn"]))["QueueArn"]
                await self.api.start_message_move_task(arn)
        except QueueError as e:
            return self._error(e, viewer)
        raise web.HTTPSeeOther(f"{ROOT}/queues/{quote(name, safe='')}?done={action}")

    # ---- refusals ----
    @staticmethod
    def _read_only(viewer: Viewer) -> web.Response:
        return _page("error.html", 403, viewer=viewer, code="ReadOnly",
                     message="This console is read-only: the server runs without credentials. "
                             "Start it with --credentials (or SQSQ_ACCESS_KEY_ID and "
                             "SQSQ_SECRET_ACCESS_KEY) to purge or redrive from here.")

    @staticmethod
    def _error(e: QueueError, viewer: Viewer) -> web.Response:
        # a page about a queue that is not there is a 404 (SQS answers the API call with 400)
        status = 404 if e.error_code is ErrorCode.QUEUE_DOES_NOT_EXIST else e.http_status
        return _page("error.html", status, viewer=viewer, code=e.code, message=e.message)


def add_routes(app: web.Application, source: ConsoleSource, auth: Authenticator,
               history: DepthHistory) -> None:
    console = Console(source, auth, history)
    action = "{action:" + "|".join(ACTIONS) + "}"
    app.router.add_get(ROOT, console.index)
    app.router.add_get(ROOT + "/", console.index)
    app.router.add_get(ROOT + "/queues/{name}", console.queue)
    app.router.add_get(ROOT + "/queues/{name}/" + action, console.confirm)
    app.router.add_post(ROOT + "/queues/{name}/" + action, console.act)
