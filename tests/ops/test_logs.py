"""--log-format json: every line a JSON object; a request's line names its request id and
queue; garbage on the HTTP port is one line, no traceback, and counted."""

from __future__ import annotations

import json
import socket

from ops.opssupport import scrape, until
from serverproc import ServerProcess
from sqsq.client import Client


def _lines(srv: ServerProcess) -> list[dict]:
    return [json.loads(line) for line in srv.log_text().splitlines() if line.strip()]


def test_json_lines_name_the_request_and_its_queue(metered: ServerProcess) -> None:
    with Client(metered.endpoint) as client:
        q = client.create_queue("logged-q")
        client.send_message(q, "x")

    def request_lines() -> list[dict]:
        return [r for r in _lines(metered) if r["logger"] == "sqsq.requests"
                and r.get("action") == "SendMessage" and r.get("queue") == "logged-q"]

    (line,) = until("the send's log line", request_lines)  # type: ignore[misc]
    assert line["request_id"] and line["level"] == "DEBUG"
    assert line["message"].startswith("SendMessage OK in ")
    assert all({"time", "level", "logger", "message"} <= set(r) for r in _lines(metered))


def test_garbage_is_one_line_no_traceback_and_counted(metered: ServerProcess) -> None:
    url = metered.metrics_url  # type: ignore[attr-defined]
    before = scrape(url).where("sqsq_client_mishaps_total")
    lines_before = len(_lines(metered))
    with socket.create_connection(("127.0.0.1", metered.http_port), timeout=10) as conn:
        conn.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        reply = conn.recv(4096)
    assert reply.startswith(b"HTTP/1.") and b" 400 " in reply[:20]

    def new_lines() -> list[dict]:
        return [r for r in _lines(metered)[lines_before:] if r["logger"] == "aiohttp.server"]

    (line,) = until("the mishap's log line", new_lines)  # type: ignore[misc]
    assert "exc" not in line and "Traceback" not in metered.log_text()
    after = scrape(url).where("sqsq_client_mishaps_total")
    assert sum(after.values()) == sum(before.values()) + 1, (before, after)
