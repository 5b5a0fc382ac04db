"""Malformed HTTP gets a short 400 that does not echo it, one log line, and the server keeps
serving; aiohttp's own reply quoted the offending bytes (12 KB of garbage got 12 KB back)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest

from serverproc import ServerProcess

MARKER = b"zqxjkvw"  # in every garbage below, and in nothing the server says by itself
GARBAGE = {
    "request line": MARKER + b" " + MARKER * 1755 + b"\r\n\r\n",
    "too long a request line": b"GET /" + MARKER * 1755 + b" HTTP/1.1\r\n\r\n",
    "bad header": (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\x01: " + MARKER * 1755
                   + b"\r\n\r\n"),
}


@pytest.fixture(params=["server", "gateway"])
def door(request: pytest.FixtureRequest) -> ServerProcess:
    return request.getfixturevalue(request.param)


def _send(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; everything the server answers before it closes."""
    reply = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(data)
        try:
            while chunk := conn.recv(65536):
                reply += chunk
        except ConnectionResetError:
            pass  # closed by the server: what came before is the reply
    return reply


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_malformed_http_gets_a_short_400(door: ServerProcess, kind: str,
                                         client_for: Callable[..., Any]) -> None:
    garbage = GARBAGE[kind]
    assert len(garbage) > 12_000
    reply = _send(door.http_port, garbage)
    assert reply.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 ")), reply[:200]
    assert len(reply) < 400, reply[:400]
    assert MARKER not in reply
    assert reply.endswith(b"\r\n\r\n400 Bad Request: malformed HTTP request\n")
    # Still serving, and the log has one line per mishap, without the garbage.
    answer = client_for(door.http_url).list_queues()
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
    log = door.log_text()
    assert "Traceback" not in log
    assert MARKER.decode() not in log
