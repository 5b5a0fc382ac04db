"""In-process Raft groups for tests: replicas ticked by the test under a fake clock.

Every replica's tick is driven by ``Group.step`` (pysyncobj's ``autoTick`` is off) and
pysyncobj's clock is replaced by ``FakeClock``, so elections and leader step-downs happen
when the test moves time, never because the machine was slow. Messages travel over real
loopback TCP; a partition drops them in the adapter's transport.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pysyncobj.syncobj
import pysyncobj.tcp_connection
import pysyncobj.transport
import pytest

from sqsq.cli.localprocs import free_port  # noqa: F401 - the tests import it from here
from sqsq.shard import raft
from sqsq.shard.raft import Proposal, RaftSettings, ShardReplica


class FakeClock:
    """Moved by the test; every read also moves it by a hair (``TICK_S``), as a real clock
    would, so loops that pysyncobj bounds by elapsed time (sending appends for at most one
    heartbeat period) end."""

    TICK_S = 0.0002

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += self.TICK_S
        return self.t


class RecordingMachine:
    """A state machine that records what it applied (a list of payloads) and snapshots it."""

    def __init__(self) -> None:
        self.applied: list[tuple[int, bytes]] = []
        self.applied_index = 0
        self.fail_on: bytes | None = None

    def apply_entry(self, index: int, data: bytes) -> Any:
        if index <= self.applied_index:
            return None
        if self.fail_on is not None and data == self.fail_on:
            raise RuntimeError("broken invariant")
        self.applied.append((index, data))
        self.applied_index = index
        return data

    def write_snapshot(self, path: str, raft_data: bytes) -> None:
        import msgpack

        with open(path, "wb") as f:
            f.write(msgpack.packb([self.applied_index, [list(a) for a in self.applied],
                                   raft_data], use_bin_type=True))

    def read_snapshot(self, path: str) -> bytes:
        import msgpack

        with open(path, "rb") as f:
            index, applied, raft_data = msgpack.unpackb(f.read(), raw=False)
        if index > self.applied_index:
            self.applied = [tuple(a) for a in applied]
            self.applied_index = index
        return raft_data

    def payloads(self) -> list[bytes]:
        return [d for _, d in self.applied]


class Group:
    """``n`` replicas in one process; ``step`` moves the clock and ticks every live one."""

    def __init__(self, root: Path, clock: FakeClock, n: int = 3, *, cut: set[str],
                 **settings: Any) -> None:
        self.root = root
        self.clock = clock
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        self.settings = settings
        self.replicas: dict[str, ShardReplica] = {}
        self.machines: dict[str, RecordingMachine] = {}
        self.stopped: set[str] = set()  # not ticked: a SIGSTOPped process
        self.cut = cut  # partitioned: every message to or from these replicas is dropped
        self.fatal: list[BaseException] = []
        for a in self.addresses:
            self.start(a, bootstrap=True)

    def start(self, address: str, *, bootstrap: bool, machine: RecordingMachine | None = None
              ) -> ShardReplica:
        machine = machine or RecordingMachine()
        directory = self.root / address.replace(":", "_")
        settings = RaftSettings(
            self_address=address, peers=list(self.addresses), directory=directory,
            bootstrap=bootstrap, auto_tick=False, on_fatal=self.fatal.append,
            **self.settings)
        replica = ShardReplica(settings, machine)
        self.replicas[address] = replica
        self.machines[address] = machine
        return replica

    def destroy(self, address: str) -> None:
        replica = self.replicas.pop(address)
        replica._doDestroy()  # noqa: SLF001 - autoTick is off: tear down in this thread

    def step(self, seconds: float = 0.01, ticks: int = 1) -> None:
        self.clock.t += seconds
        for _ in range(ticks):
            for address, replica in list(self.replicas.items()):
                if address not in self.stopped:
                    replica.doTick(0.0)

    def run(self, seconds: float, dt: float = 0.01) -> None:
        for _ in range(int(seconds / dt)):
            self.step(dt)

    def leaders(self) -> list[str]:
        return [a for a, r in self.replicas.items()
                if r.is_leader() and a not in self.stopped and a not in self.cut]

    def elect(self, limit_s: float = 30.0) -> str:
        waited = 0.0
        while waited < limit_s:
            self.step(0.02)
            waited += 0.02
            leaders = self.leaders()
            if len(leaders) == 1 and self.replicas[leaders[0]].raftLastApplied >= \
                    self.replicas[leaders[0]].raftCommitIndex > 1:
                return leaders[0]
        raise AssertionError(f"no leader within {limit_s}s of fake time")

    def propose(self, address: str, data: bytes) -> list:
        """Propose on ``address``; the list gets (status, result) when it is decided."""
        box: list = []
        self.replicas[address].propose(data, lambda status, result: box.append((status, result)))
        return box

    def commit(self, address: str, data: bytes, limit_s: float = 10.0) -> Proposal:
        box = self.propose(address, data)
        waited = 0.0
        while not box and waited < limit_s:
            self.step(0.01)
            waited += 0.01
        assert box, f"proposal {data!r} undecided after {limit_s}s of fake time"
        return box[0][0]

    def close(self) -> None:
        for address in list(self.replicas):
            self.destroy(address)


@contextmanager
def raft_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int = 3,
               **settings: Any) -> Iterator[Group]:
    clock = FakeClock()
    for module in (pysyncobj.syncobj, pysyncobj.transport, pysyncobj.tcp_connection, raft):
        if hasattr(module, "monotonicTime"):
            monkeypatch.setattr(module, "monotonicTime", clock)
    monkeypatch.setattr(raft._syncobj, "monotonicTime", clock)  # noqa: SLF001
    cut: set[str] = set()
    _install_partitions(monkeypatch, cut)  # before any connection binds its callbacks
    group = Group(tmp_path, clock, n, cut=cut, **settings)
    try:
        yield group
    finally:
        group.close()


def _install_partitions(monkeypatch: pytest.MonkeyPatch, cut: set[str]) -> None:
    send = raft._Transport.send  # noqa: SLF001
    receive = raft._Transport._onMessageReceived  # noqa: SLF001

    def cut_send(self: Any, node: Any, message: Any) -> bool:
        if self._replica.settings.self_address in cut or node.id in cut:
            return False
        return send(self, node, message)

    def cut_receive(self: Any, node: Any, message: Any) -> None:
        if self._replica.settings.self_address in cut or getattr(node, "id", None) in cut:
            return
        receive(self, node, message)

    monkeypatch.setattr(raft._Transport, "send", cut_send)  # noqa: SLF001
    monkeypatch.setattr(raft._Transport, "_onMessageReceived", cut_receive)  # noqa: SLF001
