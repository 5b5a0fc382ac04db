"""Local processes for ``sqsq cluster up`` and the tests: free 127.0.0.1 ports, and a real
``etcd`` server (Debian's etcd-server 3.4) as a child process, stopped by pid.

etcd listens on 127.0.0.1 only, on free client and peer ports, with a data dir of its own.
``stop`` + ``start`` restarts the same member on the same ports and data.

A process may also run elsewhere, e.g. in a network namespace: then it gets the address to
bind to (``host``) and a ``wrap`` that turns its argv into the command that runs it there.
Its readiness is then probed from there too, by ``python -m sqsq.cli.localprocs port|health``
run through the same ``wrap`` (this process may have no route to that address).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: Turns a process's argv into the command that runs it where it belongs.
Wrap = Callable[[list[str]], list[str]]


LOWEST_PORT = 10000


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (bind to port 0 picks from it)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


#: ``LOW-HIGH``: the ports this process and its children pick from, for several runs at once on
#: one machine (the tests' parallel workers each get a range of their own). Without it, every
#: port from LOWEST_PORT up to the ephemeral range.
PORT_RANGE_ENV = "SQSQ_PORT_RANGE"


def _range() -> tuple[int, int]:
    low, top = LOWEST_PORT, max(ephemeral_start(), LOWEST_PORT + 1000)
    spec = os.environ.get(PORT_RANGE_ENV, "")
    if spec:
        try:
            low, top = (int(part) for part in spec.split("-"))
        except ValueError:
            raise ValueError(f"{PORT_RANGE_ENV}={spec!r}: expected LOW-HIGH, "
                             f"e.g. 20000-24999") from None
        top += 1
    return low, top


def _candidate(count: int) -> int:
    """A port below the kernel's ephemeral range. A port the kernel handed out for a bind to
    port 0 is in that range, so between our check and the server's bind any outgoing
    connection (a Raft peer, an etcd client) may take it as its local port; below the range
    only a listener can."""
    low, top = _range()
    if top - count <= low:
        raise OSError(f"no room for {count} consecutive ports in {low}-{top - 1}")
    return random.randrange(low, top - count)


def free_port(attempts: int = 100) -> int:
    """A 127.0.0.1 port nothing is bound to right now, outside the ephemeral range."""
    return free_port_range(1, attempts)


# Ports this process handed out lately: a port is free until its server binds it, so two
# picks before the first server starts could otherwise return the same one (a cluster's
# nodes were once given one metrics port). A thousand covers many clusters' starts and leaves
# most of a narrow SQSQ_PORT_RANGE (a test worker's 7,500 ports) to pick from.
_HANDED_OUT: deque[int] = deque(maxlen=1000)


def reserve_ports(ports: list[int]) -> None:
    """Ports a restarted cluster takes again (its recorded ones): never handed out here."""
    _HANDED_OUT.extend(ports)


def free_port_range(count: int, attempts: int = 100) -> int:
    """The first of ``count`` consecutive free ports (a node's Raft ports: base + shard),
    none of them handed out by this process lately."""
    for _ in range(attempts):
        base = _candidate(count)
        if any(port in _HANDED_OUT for port in range(base, base + count)):
            continue
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            _HANDED_OUT.extend(range(base, base + count))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError(f"no {count} consecutive free ports found")


def port_taken(host: str, ports: list[tuple[int, str]]) -> str | None:
    """The first of ``ports`` ((port, what it is for)) that another process listens on, as
    one line naming the port and its use; None if each can be bound now (0: any port).

    A server finds out for itself only when it binds, and a process has several: it checks
    them all before it starts, so a clash is one line naming the port and its use, before
    anything is half started (once, a Raft port in use left shards without a leader for
    minutes with no error anywhere)."""
    import errno

    seen: dict[int, str] = {}
    for port, use in ports:
        if not port:
            continue
        if port in seen:
            return f"port {port} is given twice: for {seen[port]} and for {use}"
        seen[port] = use
        try:
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
                # as the servers bind: a port left in TIME_WAIT by the process's previous
                # life is free; one that something listens on is not
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((host.strip("[]"), port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} ({use}) is in use by another process"
            # no such address here, and the like: the server itself says what is wrong
    return None


def wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float = 30.0, *,
                  host: str = "127.0.0.1", wrap: Wrap | None = None) -> None:
    if wrap is not None:
        wait_by_probe(wrap(probe_argv("port", host, port, timeout_s)), proc, timeout_s,
                      f"nothing listened on {host}:{port} within {timeout_s}s")
        return
    if not _until(lambda: _port_open(host, port), timeout_s, proc):
        raise OSError(f"nothing listened on port {port} within {timeout_s}s")


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        time.sleep(0.05)
        return False


def _etcd_healthy(url: str) -> bool:
    # The client port opens before the member has elected itself; /health answers
    # {"health":"true"} only once it serves reads and writes.
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
            if json.loads(resp.read()).get("health") == "true":
                return True
    except OSError:
        pass
    time.sleep(0.05)
    return False


def _until(check: Callable[[], bool], timeout_s: float,
           proc: subprocess.Popen | None) -> bool:
    """Whether ``check`` passed within ``timeout_s``; ``OSError`` if ``proc`` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise OSError(f"process {proc.pid} exited early with {proc.returncode}")
        if check():
            return True
    return False


def probe_argv(kind: str, *args: object) -> list[str]:
    """The argv of a probe (``port HOST PORT TIMEOUT``, ``health URL TIMEOUT`` or ``ready URL
    TIMEOUT``) that exits 0 once it passes, 1 when TIMEOUT seconds have gone by."""
    return [sys.executable, "-m", "sqsq.cli.localprocs", kind, *map(str, args)]


def wait_by_probe(argv: list[str], proc: subprocess.Popen | None, timeout_s: float,
                  failure: str) -> None:
    """Run a probe (``probe_argv``, wrapped) to its end, watching ``proc`` meanwhile;
    ``OSError(failure)`` if it fails."""
    probe = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Some slack over the probe's own timeout: it has an interpreter to start first.
        deadline = time.monotonic() + timeout_s + 10.0
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise OSError(f"process {proc.pid} exited early with {proc.returncode}")
            code = probe.poll()
            if code == 0:
                return
            if code is not None:
                break
            time.sleep(0.05)
        raise OSError(failure)
    finally:
        if probe.poll() is None:
            probe.kill()
        probe.wait()


ETCD_MISSING = (
    "etcd is not installed: `make system-deps` installs Debian's etcd-server (sqsq's "
    "cluster keeps its partition map there; the tests need it and do not skip without it)"
)


def terminate(proc: subprocess.Popen, timeout_s: float) -> int:
    """Stop ``proc`` by its pid: SIGTERM (after SIGCONT: a stopped process cannot act on
    it), then SIGKILL if it has not gone within ``timeout_s``; its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


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
    host: str = "127.0.0.1"
    wrap: Wrap | None = None
    name: str = "sqsq-test"
    initial_cluster: str | None = None  # name=peer_url,... of every member (None: just this)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    def command(self) -> list[str]:
        client = f"http://{self.host}:{self.client_port}"
        argv = [
            etcd_binary(), "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster or f"{self.name}={self.peer_url}",
            "--initial-cluster-state", "new",
            "--logger", "zap", "--log-level", "warn",
        ]
        return argv if self.wrap is None else self.wrap(argv)

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def start(self, timeout_s: float = 30.0) -> EtcdProcess:
        self.launch()
        self.wait_serving(timeout_s)
        return self

    def launch(self) -> None:
        """Start the process without waiting: the members of a new etcd cluster must all
        be running before any of them serves."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir.parent / f"{self.data_dir.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def wait_serving(self, timeout_s: float = 30.0) -> None:
        assert self.proc is not None
        url = f"http://{self.host}:{self.client_port}"
        failure = f"etcd did not serve on {self.endpoint} in {timeout_s}s"
        try:
            if self.wrap is not None:
                wait_by_probe(self.wrap(probe_argv("health", url, timeout_s)), self.proc,
                              timeout_s, failure)
            elif not _until(lambda: _etcd_healthy(url), timeout_s, self.proc):
                raise OSError(failure)
        except OSError:
            if self.proc.poll() is not None:
                raise OSError(f"etcd exited early with {self.proc.returncode}; "
                              f"see {self.data_dir}.log") from None
            raise

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it does not go within 10 s."""
        assert self.proc is not None
        return terminate(self.proc, 10.0)


def _probe_main(argv: list[str]) -> int:
    """``port HOST PORT TIMEOUT``, ``health URL TIMEOUT`` or ``ready URL TIMEOUT``: 0 once it
    passes, else 1."""
    kind, *args, timeout = argv
    if kind == "port":
        ok = _until(lambda: _port_open(args[0], int(args[1])), float(timeout), None)
    elif kind == "health":
        ok = _until(lambda: _etcd_healthy(args[0]), float(timeout), None)
    elif kind == "ready":  # a node's /readyz (``rolling.node_ready``)
        from sqsq.cli.rolling import node_ready

        def ready() -> bool:
            if node_ready(args[0]):
                return True
            time.sleep(0.05)  # a refused connection answers at once: do not spin
            return False

        ok = _until(ready, float(timeout), None)
    else:
        raise SystemExit(f"unknown probe {kind!r}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(_probe_main(sys.argv[1:]))
