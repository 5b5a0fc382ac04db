from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from serverproc import GatewayProcess, ServerProcess
from sqsq.cli.cluster import LocalCluster
from sqsq.cli.localprocs import LOWEST_PORT, PORT_RANGE_ENV, ephemeral_start

# Every process the tests start, and every tool they call, shares one admin credential
# (sqsq.admincred); the tests of the credential itself take it out of a child's env.
os.environ.setdefault("SQSQ_ADMIN_TOKEN", "tests-admin-credential-" + "0" * 32)


def _worker_port_range() -> None:
    """Under `pytest -n N` (make test) each worker, and every process it starts, picks its free
    ports from a slice of its own: two workers checking the same port free before either's
    server binds it would otherwise both start a server on it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    index, count = int(worker[2:]), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    width = (ephemeral_start() - LOWEST_PORT) // count
    low = LOWEST_PORT + index * width
    os.environ[PORT_RANGE_ENV] = f"{low}-{low + width - 1}"


_worker_port_range()

# Tests that must run one at a time, in one worker: the network-namespace tests (one test
# subnet, and the host's fence rule for it) and the Spark tests (one Spark session, the JVM
# started once). The rest run file by file: a module's fixtures (a cluster, say) start once.
_SERIAL_GROUPS = {"chaos": "netns", "cluster/test_several_hosts.py": "netns",
                  "analytics": "spark"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    tests = Path(__file__).parent
    for item in items:
        where = item.path.relative_to(tests).as_posix()
        group = next((g for prefix, g in _SERIAL_GROUPS.items()
                      if where == prefix or where.startswith(prefix + "/")), where)
        item.add_marker(pytest.mark.xdist_group(group))


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
