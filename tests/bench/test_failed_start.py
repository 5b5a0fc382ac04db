"""A target that fails to start leaves its logs where the user can read them, says where,
and the run goes on with the next target; a cluster started after another in one run does
not inherit the stopped one's credential (its nodes exited 1 at start)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from bench.systems import SqsqCluster, System

from bench import cli


class ExitsAtStart(System):
    """Stands for a cluster whose node exits at start: its log says why."""

    def start(self, workdir: Path) -> dict[str, Any]:
        (workdir / "cluster" / "logs").mkdir(parents=True)
        (workdir / "cluster" / "logs" / "n2.log").write_text("port 7601 is in use\n")
        (workdir / "cluster" / "data.bin").write_bytes(b"\0" * 16)  # not a log: not kept
        raise RuntimeError("node n2 exited 1 at start")


def test_a_cluster_that_fails_to_start_keeps_its_logs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = cli.parse_args(["--out", str(tmp_path / "out")])
    result: dict[str, Any] = {"targets": {}}
    cli.run_target("sqsq-cluster", ExitsAtStart, args, [], result, tmp_path / "r.json")
    entry = result["targets"]["sqsq-cluster"]
    assert entry["status"] == "failed"
    assert "node n2 exited 1 at start" in entry["reason"]
    kept = Path(entry["logs"])
    assert kept.parent == tmp_path / "out" / "failed-starts"
    assert (kept / "cluster" / "logs" / "n2.log").read_text() == "port 7601 is in use\n"
    assert not (kept / "cluster" / "data.bin").exists()
    assert f"its logs are kept in {kept}" in capsys.readouterr().out


class FakeCluster:
    """Stands for ``LocalCluster``: it points this process at its credential, as the real
    one does (``admincred.use_directory``), and records the env its children would get."""

    started: list[dict[str, str]] = []

    def __init__(self, root: Path, *, env: dict[str, str], **_: object) -> None:
        self.root, self.env = root, env
        self.gateway = SimpleNamespace(endpoint="127.0.0.1:1")

    def start(self) -> FakeCluster:
        FakeCluster.started.append(self.env)
        os.environ["SQSQ_ADMIN_TOKEN_FILE"] = str(self.root / "admin-token")
        return self

    def stop(self) -> None:
        pass


def test_a_cluster_does_not_inherit_the_credential_of_the_one_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqsq.cli.cluster

    monkeypatch.setattr(sqsq.cli.cluster, "LocalCluster", FakeCluster)
    monkeypatch.delenv("SQSQ_ADMIN_TOKEN_FILE", raising=False)
    monkeypatch.delenv("SQSQ_ADMIN_TOKEN", raising=False)
    for name in ("one", "two"):
        system = SqsqCluster(shards=1)
        system.start(tmp_path / name)
        system.stop()  # its directory goes with it
        assert "SQSQ_ADMIN_TOKEN_FILE" not in os.environ
    # The second cluster's nodes were not handed the first one's (deleted) token file.
    assert all("SQSQ_ADMIN_TOKEN_FILE" not in env for env in FakeCluster.started)
