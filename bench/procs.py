"""Local server processes for the benchmark: started on 127.0.0.1 ports, stopped by pid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from sqsq.cli.localprocs import free_port  # noqa: F401 - bench modules import it from here


def stop_on_sigterm() -> None:
    """SIGTERM unwinds the run as Ctrl-C does, so that every server it started is stopped
    (by default the signal ends Python at once, and its clusters live on)."""

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system) used so far by these processes and every live descendant of
    theirs (a server started through a wrapper runs as its child), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[int, tuple[int, float]] = {}  # pid -> (parent pid, seconds)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        used[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    wanted = set(pids)
    total = 0.0
    for pid, (_parent, seconds) in used.items():
        ancestor = pid
        while ancestor > 1 and ancestor not in wanted:
            ancestor = used.get(ancestor, (0, 0.0))[0]
        if ancestor in wanted:
            total += seconds
    return total


def find_exe(name: str, *extra: Path) -> str | None:
    """An executable: next to this Python first (pip-installed binaries), then PATH, then
    the extra places given."""
    for candidate in (Path(sys.executable).parent / name, *(p / name for p in extra)):
        if candidate.exists() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


class Proc:
    """One child process with its log file; ``stop`` signals its pid, then kills it."""

    def __init__(self, name: str, argv: list[str], log_path: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})}, cwd=cwd)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_port(self, port: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited early ({self.popen.returncode}); "
                                   f"log: {self.log_tail()}")
            if port_open(port):
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name}: nothing listened on {port} within {timeout_s}s")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
        if not self.alive():
            return
        os.kill(self.pid, sig)
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)

    def log_tail(self, n: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""
