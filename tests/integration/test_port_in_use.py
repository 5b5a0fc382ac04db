"""A second server on a gRPC port already taken fails to start with one clear line; gRPC's
SO_REUSEPORT default would let it start, and clients would then alternate between two data
sets."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from serverproc import REPO, ServerProcess, free_port
from sqsq.client import Client


def test_second_server_on_a_taken_grpc_port_exits_with_one_line(tmp_path) -> None:  # noqa: ANN001
    first = ServerProcess(tmp_path / "first").start()
    try:
        with Client(first.endpoint, timeout=30) as client:
            url = client.create_queue(f"port-{uuid.uuid4().hex[:12]}")
            second = subprocess.Popen(
                [sys.executable, "-m", "sqsq.cli.main", "server",
                 "--data-dir", str(tmp_path / "second"), "--host", "127.0.0.1",
                 "--grpc-port", str(first.grpc_port), "--http-port", str(free_port())],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
            try:
                out, err = second.communicate(timeout=45)
            except subprocess.TimeoutExpired:
                second.kill()
                out, err = second.communicate()
                pytest.fail(f"a second server started on the taken gRPC port: {out!r}")
            # The first server still answers, with its own data.
            assert client.get_queue_url(url.rsplit("/", 1)[-1]) == url
            client.send_message(url, "still here")
            assert [m.body for m in client.receive_message(url, wait_time_seconds=1)] == [
                "still here"]
    finally:
        first.stop()
    assert second.returncode == 1, (out, err)
    assert err.splitlines() == [f"sqsq server: error: port {first.grpc_port} on 127.0.0.1 "
                                "(gRPC) is in use by another process"]
    assert "gRPC on" not in out  # it never announced itself as serving
