"""Start and stop a real ``sqsq server`` process for tests, on 127.0.0.1, stopped by pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sqsq.cli.localprocs import free_port, terminate, wait_for_port

__all__ = ["DOORS", "REPO", "ServerProcess", "free_port", "wait_for_port"]

# The doors the HTTP and SDK suites run through (fixtures of tests/conftest.py): the
# single-node server's own, a gateway in front of it, and a cluster's gateway (etcd, three
# nodes, two shards).
DOORS = ["server", "gateway", "cluster"]

REPO = Path(__file__).resolve().parent.parent


@dataclass
class ServerProcess:
    data_dir: Path
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def command(self) -> list[str]:
        return ["server", "--data-dir", str(self.data_dir)]

    def start(self) -> ServerProcess:
        log = open(self.data_dir.parent / f"{self.data_dir.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sqsq.cli.main", *self.command(),
             "--host", "127.0.0.1", "--grpc-port", str(self.grpc_port),
             "--http-port", str(self.http_port), *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **self.env},
        )
        log.close()
        wait_for_port(self.grpc_port, self.proc)
        return self

    def stop(self) -> int:
        """SIGTERM and wait: a clean shutdown."""
        assert self.proc is not None
        return terminate(self.proc, 15.0)

    def kill9(self) -> None:
        """kill -9: no chance to flush anything."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def log_text(self) -> str:
        path = self.data_dir.parent / f"{self.data_dir.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@dataclass
class GatewayProcess(ServerProcess):
    """``sqsq gateway`` in front of the node at ``backend`` (its gRPC host:port); its log
    goes next to ``data_dir``, which it does not otherwise use."""

    backend: str = ""

    def command(self) -> list[str]:
        return ["gateway", "--backend", self.backend]
