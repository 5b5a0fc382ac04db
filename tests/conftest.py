from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from serverproc import GatewayProcess, ServerProcess
from sqsq.cli.cluster import LocalCluster

# Every process the tests start, and every tool they call, shares one admin credential
# (sqsq.admincred); the tests of the credential itself take it out of a child's env.
os.environ.setdefault("SQSQ_ADMIN_TOKEN", "tests-admin-credential-" + "0" * 32)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real ``sqsq server`` shared by the integration tests (each uses its own queues)."""
    srv = ServerProcess(tmp_path_factory.mktemp("server") / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def fresh_server(tmp_path) -> Iterator[ServerProcess]:  # noqa: ANN001
    """A server of the test's own, for restarts and crashes."""
    srv = ServerProcess(tmp_path / "data").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def gateway(server: ServerProcess,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """``sqsq gateway`` in front of the shared server, stopped by pid at the end."""
    gw = GatewayProcess(tmp_path_factory.mktemp("gateway") / "gateway",
                        backend=server.endpoint).start()
    yield gw
    gw.stop()


class ClusterDoor:
    """A cluster's gateway, looking to the suites like the other doors."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.endpoint = cluster.gateway.endpoint
        self.http_url = cluster.gateway.http_url
        self.http_port = cluster.gateway.http_port

    def log_text(self) -> str:
        return Path(self.cluster.root, "logs", "gateway.log").read_text(errors="replace")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterDoor]:
    """A real cluster started as ``sqsq cluster up`` starts one, stopped by pid at the end."""
    c = LocalCluster(tmp_path_factory.mktemp("suite-cluster"), nodes=3, shards=2).start()
    yield ClusterDoor(c)
    c.stop()
