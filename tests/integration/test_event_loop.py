"""The event loop a server process runs on: uvloop's unless ``SQSQ_EVENT_LOOP`` names the
standard library's; a name it does not know stops the process with one line."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from serverproc import REPO, ServerProcess, free_port
from sqsq.client import Client


def _loaded(pid: int, library: str) -> bool:
    return library in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("env, on_uvloop", [({}, True),
                                            ({"SQSQ_EVENT_LOOP": "asyncio"}, False)])
def test_a_server_serves_on_either_event_loop(tmp_path: Path, env: dict[str, str],
                                              on_uvloop: bool) -> None:
    server = ServerProcess(tmp_path / "data", env=env).start()
    try:
        assert server.proc is not None
        assert _loaded(server.proc.pid, "uvloop") is on_uvloop
        with Client(server.endpoint, timeout=30) as client:
            url = client.create_queue(f"loop-{uuid.uuid4().hex[:12]}")
            client.send_message(url, "on this loop")
            got = client.receive_message(url, wait_time_seconds=5)
            assert [m.body for m in got] == ["on this loop"]
            client.delete_message(url, got[0].receipt_handle)
    finally:
        assert server.stop() == 0


def test_an_unknown_event_loop_stops_the_server_with_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sqsq.cli.main", "server", "--data-dir", str(tmp_path / "d"),
         "--host", "127.0.0.1", "--grpc-port", str(free_port()), "--http-port",
         str(free_port())],
        capture_output=True, text=True, cwd=REPO, timeout=60,
        env={**os.environ, "SQSQ_EVENT_LOOP": "trio"})
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stderr.splitlines() == [
        "sqsq server: error: SQSQ_EVENT_LOOP is 'trio'; it takes one of uvloop, asyncio"]
