"""``cluster up``'s supervisor on its own, with a stand-in cluster and clock: a process that
dies is reported once with its exit status; with ``--restart on-failure`` it is started again
after a back-off that doubles up to 30 s and starts over once the process has run a minute."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sqsq.cli.supervisor import Supervisor, exit_description


@dataclass
class Proc:
    pid: int
    returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


@dataclass
class Cluster:
    root: Path = Path("/c")
    procs: dict[str, Proc] = field(default_factory=lambda: {
        n: Proc(i) for i, n in enumerate(("etcd", "n1", "n2", "n3", "gateway"))})
    fail_starts: int = 0
    started: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        return list(self.procs)

    def process(self, name: str) -> Proc:
        if name not in self.procs:
            raise KeyError(f"no process {name!r}")
        return self.procs[name]

    def start_process(self, name: str) -> None:
        if self.fail_starts:
            self.fail_starts -= 1
            raise OSError("nothing listened on port 1234 within 30.0s")
        self.started.append(name)
        self.procs[name] = Proc(100 + len(self.started))

    def write_json(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_exit_statuses_read_as_a_person_reads_them() -> None:
    assert exit_description(-9) == "killed by SIGKILL"
    assert exit_description(-15) == "killed by SIGTERM"
    assert exit_description(1) == "exited with status 1"


def test_a_dead_node_is_reported_once_and_left_down_by_default() -> None:
    cluster, lines = Cluster(), []
    sup = Supervisor(cluster, say=lines.append, clock=Clock())
    cluster.procs["n2"].returncode = -9
    for _ in range(3):
        sup.check()
    assert lines == ["n2 killed by SIGKILL; the others keep serving; start it again with: "
                     "sqsq cluster start-node --dir /c n2"]
    assert cluster.started == []
    assert sup.start("n2") is None and cluster.started == ["n2"]
    assert sup.start("n2") == "n2 is running (pid 101)"
    assert sup.start("n7") == "no process 'n7'"


def test_restart_on_failure_backs_off_and_starts_over_after_a_minute_up() -> None:
    cluster, lines, clock = Cluster(fail_starts=1), [], Clock()
    sup = Supervisor(cluster, restart=True, say=lines.append, clock=clock)
    cluster.procs["gateway"].returncode = 1
    sup.check()
    assert lines[-1] == "gateway exited with status 1; the others keep serving; starting it " \
                        "again in 1 s"
    clock.now = 0.9
    sup.check()
    assert cluster.started == []
    clock.now = 1.0
    sup.check()  # the first start fails: tried again 2 s later
    assert lines[-1].startswith("gateway did not start again: nothing listened on port 1234")
    clock.now = 2.9
    sup.check()
    assert cluster.started == []
    clock.now = 3.0
    sup.check()
    assert cluster.started == ["gateway"] and lines[-1] == "gateway started again (pid 101)"
    cluster.procs["gateway"].returncode = -9  # dies at once: the back-off goes on doubling
    sup.check()
    assert lines[-1].endswith("starting it again in 4 s")
    clock.now = 7.0
    sup.check()
    clock.now = 7.0 + 60
    cluster.procs["gateway"].returncode = -9  # after a minute up: from 1 s again
    sup.check()
    assert lines[-1].endswith("starting it again in 1 s")
