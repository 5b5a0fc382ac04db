"""How a process logs: one line per event, as text or as JSON (``--log-format``), and every
line written while a request is being handled carries that request's id, action and queue.

The request's fields live in a context variable that the doors set when a request arrives
(``bind``); asyncio copies it into every task the request starts, so a line logged deep in
the shard or the router about that request carries them too, with no logger passed down.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import os
import sys
from typing import NamedTuple

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RequestFields(NamedTuple):
    """(A tuple: made for every request, and a frozen dataclass costs several times more.)"""

    request_id: str
    action: str
    queue: str = ""


_current: contextvars.ContextVar[RequestFields | None] = contextvars.ContextVar(
    "sqsq_request", default=None)


def bind(request_id: str, action: str, queue: str = "") -> contextvars.Token:
    """From here on (in this task and those it starts), log lines name this request."""
    return _current.set(RequestFields(request_id, action, queue))


def unbind(token: contextvars.Token) -> None:
    _current.reset(token)


def current() -> RequestFields | None:
    return _current.get()


class _RequestFilter(logging.Filter):
    """Puts the request's fields on every record (as attributes the formatters read)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _current.get()
        if fields is not None and not hasattr(record, "request_id"):
            record.request_id = fields.request_id
            record.action = fields.action
            record.queue = fields.queue
        return True


def _request_part(record: logging.LogRecord) -> dict[str, str]:
    out = {}
    for name in ("request_id", "action", "queue"):
        value = getattr(record, name, "")
        if value:
            out[name] = value
    return out


class TextFormatter(logging.Formatter):
    """The classic line, with ``[request_id=... action=... queue=...]`` when about a request."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        part = _request_part(record)
        if not part:
            return line
        fields = " ".join(f"{k}={v}" for k, v in part.items())
        first, sep, rest = line.partition("\n")  # after the message, before any traceback
        return f"{first} [{fields}]{sep}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the request's fields, and a
    traceback (``exc``, one string) only for real errors."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
            .isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_request_part(record),
        }
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False)


_format = "text"


def json_mode() -> bool:
    return _format == "json"


def setup(log_format: str = "text") -> None:
    """Log to stderr at ``SQSQ_LOG_LEVEL`` (INFO) in ``log_format``; replaces the root
    logger's handlers (a process configures logging once, here)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(LOG_FORMATS)}, "
                         f"not {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(_RequestFilter())
    global _format
    _format = log_format
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(os.environ.get("SQSQ_LOG_LEVEL", "INFO"))
