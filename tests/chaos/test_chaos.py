"""The chaos suite's short form (``make chaos`` runs every scenario, longer): a few scenarios
on one cluster in network namespaces, each checked message by message, and no namespace or
process left behind afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.chaosrun import run_scenario
from chaos.checker import is_ok
from chaos.faults import ChaosCluster
from chaos.netns import PREFIX, namespaces, pid_alive, require_tools
from chaos.scenarios import BY_NAME

SECONDS = 10.0  # of faults per scenario; the load runs a few seconds longer
SHORT = ("kill-leader", "partition-leader", "pause-leader")


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosCluster]:
    require_tools()  # fails (never skips) without root, ip and iptables
    root = tmp_path_factory.mktemp("chaos")
    with ChaosCluster(root / "cluster") as cc:
        yield cc
        tag, pids = cc.net.tag, cc.net.pids()  # everything running there at the end
    assert not [ns for ns in namespaces(PREFIX) if ns.startswith(f"{tag}-")], "namespaces left"
    assert not [pid for pid in pids if pid_alive(pid)], "processes left"


@pytest.mark.parametrize("name", SHORT)
def test_a_scenario_loses_nothing_and_accepts_no_stale_handle(
        chaos: ChaosCluster, name: str, tmp_path: Path) -> None:
    outcome = run_scenario(chaos, BY_NAME[name], seconds=SECONDS, seed=1, workdir=tmp_path)
    r = outcome.report
    assert outcome.faults >= 1
    assert r.sends_acknowledged > 0 and r.delivered_messages > 0
    assert r.drain_complete
    assert (r.lost, r.unexpected, r.stale_deletes_accepted, r.fifo_violations) == (0, 0, 0, 0), \
        r.details
    assert outcome.time_regressions == 0 and r.resurrected == 0
    assert is_ok(r) and outcome.ok

