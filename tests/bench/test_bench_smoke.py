"""The benchmark still runs: about a second of each kind of workload against a real server.

Only that every operation moved messages is checked; the numbers themselves are measured
and reported by ``make bench``, never asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serverproc import ServerProcess

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench_server(tmp_path: Path):  # noqa: ANN201
    srv = ServerProcess(tmp_path / "data").start()
    yield srv
    srv.stop()


def test_bench_runs_against_sqsq_server(bench_server: ServerProcess, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.chdir(REPO)
    from bench.cli import main

    out = tmp_path / "out"
    # sqsq-gateway starts its own server and a gateway in front of it; sqsq-grpc-prefetch
    # receives one message at a time through the SDK's prefetchers.
    targets = ("sqsq-grpc", "sqsq-gateway", "sqsq-grpc-prefetch")
    rc = main(["--sqsq-endpoint", bench_server.endpoint, "--targets", ",".join(targets),
               "--workloads", "send-10x100B,steady-1x100B", "--duration", "1",
               "--producers", "1", "--consumers", "1", "--inflight", "4",
               "--out", str(out), "--no-chart"])
    assert rc == 0
    result = json.loads((out / "result.json").read_text())
    expected = {"send-10x100B": {"send"}, "steady-1x100B": {"send", "receive", "delete"}}
    for name in targets:
        target = result["targets"][name]
        assert target["status"] == "ok", (name, target)
        for workload, ops in expected.items():
            got = target["workloads"][workload]["ops"]
            assert set(got) == ops, (name, workload, got)
            for op in ops:
                assert got[op]["msgs_per_s"] > 0, (name, workload, op, got[op])
                assert got[op]["errors"] == 0, (name, workload, op, got[op])
