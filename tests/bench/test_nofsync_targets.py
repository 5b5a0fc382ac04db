"""The clusters without fsync (``sqsq-cluster-nofsync``, ``sqsq-cluster-4-nofsync``): what
the Raft logs' fsyncs cost, measured only when asked for by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import cli, systems
from sqsq.cli import cluster


def test_a_full_run_leaves_out_the_targets_that_do_not_fsync() -> None:
    known = list(systems.targets())
    everything = cli.chosen(known, True, "")
    assert "sqsq-cluster-4" in everything and "sqsq-cluster-4-nofsync" in known
    assert not [n for n in everything if n.endswith("-nofsync")]
    assert cli.chosen(known, False, "sqsq-cluster, sqsq-cluster-nofsync") == [
        "sqsq-cluster", "sqsq-cluster-nofsync"]


@pytest.mark.parametrize(("name", "node_args"), [
    ("sqsq-cluster-4", ()), ("sqsq-cluster-4-nofsync", ("--no-fsync",))])
def test_the_nodes_of_a_cluster_without_fsync_run_with_no_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
        node_args: tuple[str, ...]) -> None:
    started: list[dict[str, Any]] = []

    class Started(Exception):
        pass

    class FakeCluster:
        def __init__(self, root: Path, **kwargs: Any) -> None:
            started.append(kwargs)

        def start(self) -> None:
            raise Started

    monkeypatch.setattr(cluster, "LocalCluster", FakeCluster)
    system = systems.targets()[name]()
    with pytest.raises(Started):
        system.start(tmp_path)
    system.stop()
    assert started[0]["node_args"] == node_args and started[0]["shards"] == 4
