"""Local processes for ``sqsq cluster up`` and the tests: free 127.0.0.1 ports, and a real
``etcd`` server (Debian's etcd-server 3.4) as a child process, stopped by pid.

etcd listens on 127.0.0.1 only, on free client and peer ports, with a data dir of its own.
``stop`` + ``start`` restarts the same member on the same ports and data.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_range(count: int, attempts: int = 50) -> int:
    """The first of ``count`` consecutive free ports (a node's Raft ports: base + shard)."""
    for _ in range(attempts):
        base = free_port()
        if base + count > 65535:
            continue
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError(f"no {count} consecutive free ports found")


def wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise OSError(f"process {proc.pid} exited early with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise OSError(f"nothing listened on port {port} within {timeout_s}s")


ETCD_MISSING = (
    "etcd is not installed: `make system-deps` installs Debian's etcd-server (sqsq's "
    "cluster keeps its partition map there; the tests need it and do not skip without it)"
)


def etcd_binary() -> str:
    path = shutil.which("etcd")
    if path is None:
        # Fail, never skip: a missing etcd is a broken machine, not an optional feature.
        raise OSError(ETCD_MISSING)
    return path


@dataclass
class EtcdProcess:
    data_dir: Path
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            etcd_binary(), "--name", "sqsq-test", "--data-dir", str(self.data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"sqsq-test={peer}", "--initial-cluster-state", "new",
            "--logger", "zap", "--log-level", "warn",
        ]

    def start(self, timeout_s: float = 30.0) -> EtcdProcess:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir.parent / f"{self.data_dir.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_serving(timeout_s)
        return self

    def _wait_serving(self, timeout_s: float) -> None:
        # The client port opens before the member has elected itself; /health answers
        # {"health":"true"} only once it serves reads and writes.
        import json
        import urllib.request

        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise OSError(f"etcd exited early with {self.proc.returncode}; "
                                   f"see {self.data_dir}.log")
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{self.client_port}/health", timeout=1) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        return
            except OSError as exc:
                last = exc
            time.sleep(0.05)
        raise OSError(f"etcd did not serve on {self.endpoint} in {timeout_s}s: {last}")

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it does not go within 10 s."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

