"""What ``sqsq cluster up`` does while its cluster runs: it supervises the processes.

A process that dies (a node, the gateway, etcd) is reported in one line with its exit
status, and the others keep serving: a kill -9 of a leader is what the cluster exists to
survive, so the user sees the failover (and, with a spare node, ``--replace-after``) at
work. It stays dead unless ``--restart on-failure`` is given (then it is started again
after a back-off: 1 s, doubling up to 30 s, back to 1 s once it has run for a minute) or
the user asks for it:

    sqsq cluster start-node --dir ./cluster n1      # or: gateway, etcd

``start-node`` asks the running ``cluster up``, which owns the processes (so Ctrl-C still
stops them all): it writes ``DIR/start-request.json`` and sends SIGUSR2; ``up`` starts the
process with the same identity, ports and data and answers in ``DIR/start.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqsq.cli.cluster import LocalCluster

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
BACKOFF_RESET_S = 60.0  # a process that ran this long starts its next back-off from the first
START_REQUEST = "start-request.json"  # written by `cluster start-node`, then SIGUSR2
START_STATE = "start.json"  # `cluster up`'s answer to it
START_TIMEOUT_S = 120.0


def exit_description(returncode: int) -> str:
    """A process's exit status as a person reads it: "killed by SIGKILL", "exited with
    status 1"."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


class Supervisor:
    """Watches a started ``LocalCluster``: ``check`` reports each process that died (once)
    and, with ``restart``, starts it again when its back-off is over."""

    def __init__(self, cluster: LocalCluster, *, restart: bool = False,
                 say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster = cluster
        self.restart = restart
        self.say = say or (lambda line: print(f"sqsq cluster: {line}", flush=True))
        self.clock = clock
        self.down: set[str] = set()
        self.due: dict[str, float] = {}  # name -> when to start it again
        self.backoff: dict[str, float] = {}
        self.started_at: dict[str, float] = {name: clock() for name in cluster.names()}

    def check(self) -> None:
        now = self.clock()
        for name in self.cluster.names():
            proc = self.cluster.process(name)
            if name not in self.down and proc is not None and proc.poll() is not None:
                self._died(name, proc.returncode, now)
            elif name in self.due and now >= self.due[name]:
                del self.due[name]
                error = self.start(name)
                if error is not None:
                    self.say(f"{name} did not start again: {error}")
                    self._schedule(name, now)

    def _died(self, name: str, returncode: int, now: float) -> None:
        self.down.add(name)
        if now - self.started_at.get(name, now) >= BACKOFF_RESET_S:
            self.backoff.pop(name, None)
        what = exit_description(returncode)
        if self.restart:
            wait = self._schedule(name, now)
            self.say(f"{name} {what}; the others keep serving; starting it again in "
                     f"{wait:g} s")
        else:
            self.say(f"{name} {what}; the others keep serving; start it again with: sqsq "
                     f"cluster start-node --dir {self.cluster.root} {name}")

    def _schedule(self, name: str, now: float) -> float:
        wait = self.backoff.get(name, BACKOFF_FIRST_S)
        self.backoff[name] = min(wait * 2, BACKOFF_MAX_S)
        self.due[name] = now + wait
        return wait

    def start(self, name: str) -> str | None:
        """Start ``name`` again (same identity, ports and data); what went wrong, if
        anything."""
        try:
            proc = self.cluster.process(name)
        except KeyError as exc:
            return str(exc.args[0])
        if proc is not None and proc.poll() is None:
            return f"{name} is running (pid {proc.pid})"
        try:
            self.cluster.start_process(name)
        except OSError as exc:
            return f"{exc} (log in {self.cluster.root / 'logs'})"
        self.down.discard(name)
        self.due.pop(name, None)
        self.started_at[name] = self.clock()
        self.cluster.write_json()  # its new pid
        self.say(f"{name} started again (pid {self.cluster.process(name).pid})")  # type: ignore[union-attr]
        return None

    def serve_start_request(self) -> None:
        """Carry out ``cluster start-node``'s request, answering in ``start.json``."""
        root = self.cluster.root
        try:
            request = json.loads((root / START_REQUEST).read_text())
            request_id, name = request["id"], request["name"]
        except (OSError, ValueError, KeyError):
            return
        error = self.start(name)
        answer = {"id": request_id, "name": name, "state": "failed" if error else "done",
                  **({"error": error} if error else {})}
        tmp = root / (START_STATE + ".tmp")
        tmp.write_text(json.dumps(answer) + "\n")
        os.replace(tmp, root / START_STATE)


def start_on_signal() -> threading.Event:
    asked = threading.Event()
    signal.signal(signal.SIGUSR2, lambda *_: asked.set())
    return asked


def add_parser(sub: argparse._SubParsersAction) -> None:
    sn = sub.add_parser("start-node",
                        help="start a process of a running `cluster up` again, as itself")
    sn.add_argument("name", metavar="NODE",
                    help="a node id (n1, n2, ...), or gateway, or etcd")
    sn.add_argument("--dir", type=Path, default=Path("./cluster"),
                    help="the directory of the running `cluster up`")
    sn.set_defaults(handler=cmd_start_node, needs_client=False)


def running_supervisor(root: Path) -> int | None:
    """The pid of the ``cluster up`` running the cluster in ``root``, if one is."""
    try:
        pid = json.loads((root / "cluster.json").read_text()).get("supervisor_pid")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(pid, int) or pid == os.getpid():
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    # a pid reused by another program is not our supervisor
    return pid if b"cluster" in cmdline and b"up" in cmdline else None


def cmd_start_node(args: argparse.Namespace) -> int:
    import secrets

    pid = running_supervisor(args.dir)
    if pid is None:
        print(f"sqsq cluster start-node: error: the cluster in {args.dir} is not running "
              f"(start it with: sqsq cluster up --dir {args.dir})", file=sys.stderr)
        return 1
    request_id = secrets.token_hex(8)
    tmp = args.dir / (START_REQUEST + ".tmp")
    tmp.write_text(json.dumps({"id": request_id, "name": args.name}) + "\n")
    os.replace(tmp, args.dir / START_REQUEST)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            answer: dict[str, Any] = json.loads((args.dir / START_STATE).read_text())
        except (OSError, ValueError):
            answer = {}
        if answer.get("id") == request_id:
            if answer["state"] == "done":
                print(f"{args.name} started again")
                return 0
            print(f"sqsq cluster start-node: error: {answer.get('error')}", file=sys.stderr)
            return 1
        if running_supervisor(args.dir) != pid:
            print("sqsq cluster start-node: error: `sqsq cluster up` exited", file=sys.stderr)
            return 1
        time.sleep(0.1)
    print("sqsq cluster start-node: error: no answer from `sqsq cluster up` in time",
          file=sys.stderr)
    return 1
