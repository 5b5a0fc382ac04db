"""``sqsq cluster up`` run as a user runs it: a child process in the foreground, read through
its output, stopped with Ctrl-C (SIGINT) by pid; and the other ``sqsq cluster`` commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from serverproc import REPO
from sqsq.cli.clusterstatus import read_status
from sqsq.cli.localprocs import terminate

READY_LINE = "Ctrl-C stops everything."


def until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.1)


def sqsq(*args: str, timeout_s: float = 180.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sqsq.cli.main", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s)


class ClusterUp:
    """One ``sqsq cluster up --dir ROOT ARGS`` in the foreground, its output in a log."""

    def __init__(self, root: Path, *args: str) -> None:
        self.root = root
        self.args = args
        self.log = root.parent / f"{root.name}-up.log"
        self.proc: subprocess.Popen | None = None
        self.seen = 0  # the log's length when this run started

    def start(self, timeout_s: float = 180.0) -> ClusterUp:
        self.seen = self.log.stat().st_size if self.log.exists() else 0
        out = open(self.log, "ab")  # noqa: SIM115 - the child's
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sqsq.cli.main", "cluster", "up", "--dir", str(self.root),
             *self.args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        self.wait_for(READY_LINE, timeout_s)
        return self

    def output(self) -> str:
        """What this run of ``cluster up`` printed so far."""
        with open(self.log, "rb") as f:
            f.seek(self.seen)
            return f.read().decode(errors="replace")

    def wait_for(self, text: str, timeout_s: float = 60.0, *, after: int = 0) -> str:
        """The first line of this run's output (past its first ``after`` characters)
        holding ``text``."""
        def found() -> str | None:
            line = next((ln for ln in self.output()[after:].splitlines() if text in ln),
                        None)
            if line is None and self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"cluster up exited {self.proc.returncode}:\n"
                                     f"{self.output()}")
            return line
        return until(found, timeout_s, f"{text!r} in the output of cluster up")

    def info(self) -> dict[str, Any]:
        return json.loads((self.root / "cluster.json").read_text())

    def pid(self, name: str) -> int:
        info = self.info()
        if name == "gateway":
            return info[name]["pid"]
        if name.startswith("etcd"):
            return next(e["pid"] for e in info["etcd_members"] if e["name"] == name)
        return next(n["pid"] for n in info["nodes"] if n["id"] == name)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.info()['gateway']['grpc_port']}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.info()['gateway']['http_port']}"

    def status(self) -> dict[str, Any]:
        info = self.info()
        return read_status(",".join(f"127.0.0.1:{e['client_port']}"
                                    for e in info.get("etcd_members") or [info["etcd"]]))

    def ready(self) -> dict[str, Any] | None:
        """The status once every node is alive and every shard has a leader."""
        try:
            status = self.status()
        except Exception:  # noqa: BLE001 - etcd restarting: not ready yet
            return None
        ok = all(n["alive"] for n in status["nodes"]) and status["shards"] and \
            all(s["leader"] for s in status["shards"])
        return status if ok else None

    def interrupt(self, timeout_s: float = 90.0) -> int:
        """Ctrl-C, as a user stops it; its exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        """Whatever is left of it, by pid (the test's cleanup)."""
        if self.proc is not None and self.proc.poll() is None:
            terminate(self.proc, 90.0)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (dead, not yet reaped by its parent) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
