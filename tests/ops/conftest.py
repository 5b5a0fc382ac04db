from __future__ import annotations

from collections.abc import Iterator

import pytest

from serverproc import ServerProcess, free_port


@pytest.fixture(scope="package")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A ``sqsq server`` of these tests' own (its counts start at zero), with a metrics port,
    JSON logs, DEBUG (a line per request)."""
    port = free_port()
    srv = ServerProcess(tmp_path_factory.mktemp("metered") / "data",
                        extra_args=("--metrics-port", str(port), "--log-format", "json"),
                        env={"SQSQ_LOG_LEVEL": "DEBUG"})
    srv.metrics_url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    srv.start()
    yield srv
    srv.stop()
