"""Network mishaps log one line each, rate-limited; real errors keep their traceback."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from sqsq.gateway.http import app as http_app
from sqsq.gateway.http.quietlog import LINES_PER_WINDOW, WINDOW_S, OneLineRateLimited
from sqsq.gateway.http.wire import WireError


def _record(msg: str, exc: BaseException | None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc else None
    return logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, msg, ("1.2.3.4",),
                             exc_info)


def test_mishaps_are_one_line_and_rate_limited() -> None:
    now = [0.0]
    f = OneLineRateLimited(clock=lambda: now[0])
    passed = []
    for _ in range(LINES_PER_WINDOW + 3):
        r = _record("Error handling request from %s", ConnectionResetError("peer gone\nmore"))
        if f.filter(r):
            passed.append(r)
    assert len(passed) == LINES_PER_WINDOW
    assert passed[0].getMessage() == (
        "Error handling request from 1.2.3.4: ConnectionResetError: peer gone")
    assert passed[0].exc_info is None
    now[0] += WINDOW_S
    r = _record("Error handling request from %s", ConnectionResetError("again"))
    assert f.filter(r) and "(3 similar suppressed)" in r.getMessage()
    real = _record("internal error in %s", ValueError("a bug"))
    for _ in range(LINES_PER_WINDOW + 3):
        assert f.filter(real) and real.exc_info is not None  # never dropped, traceback kept


class _SlowRequest:
    content_length = 10

    async def read(self) -> bytes:
        await asyncio.sleep(10)
        return b""


def test_a_body_that_never_comes_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_app, "BODY_READ_TIMEOUT_S", 0.05)
    request: Any = _SlowRequest()
    with pytest.raises(WireError) as e:
        asyncio.run(http_app._read_body(request))
    assert (e.value.status, e.value.code) == (408, "RequestTimeout")
