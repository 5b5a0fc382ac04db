from __future__ import annotations

from collections.abc import Iterator

import pytest

from serverproc import GatewayProcess, ServerProcess


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
