"""A follower installing a snapshot swaps its store while the process may be reading it (a
metrics scrape, the console, a receive's attribute lookup): a read under way finishes on the
old store before it is closed, and a read during the swap is answered ServiceUnavailable,
never with an error from a closed RocksDB handle."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sqsq.core import commands as c
from sqsq.core import queries
from sqsq.core.entry import Entry, encode_entry
from sqsq.core.state import ShardConfig
from sqsq.errors import QueueError
from sqsq.shard import statemachine
from sqsq.shard.engine import ShardEngine
from sqsq.shard.statemachine import ShardMachine

CONFIG = ShardConfig(0, b"k" * 32)
WAIT = ["ReceiveMessageWaitTimeSeconds"]


def _until(condition) -> None:  # noqa: ANN001
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the install never got there"
        time.sleep(0.001)


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    """A snapshot at index 2 of a store that has queue ``orders`` (the follower's not)."""
    leader = ShardMachine(tmp_path / "leader", CONFIG)
    leader.apply_entry(1, encode_entry(Entry(1000, (c.CreateQueue("orders"),))))
    leader.apply_entry(2, encode_entry(Entry(1001, (c.CreateQueue("more"),))))
    path = tmp_path / "snap"
    leader.write_snapshot(str(path), b"raft")()
    leader.close()
    return path


def test_a_read_during_the_swap_is_refused_not_crashed(
        tmp_path: Path, snapshot: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    follower = ShardMachine(tmp_path / "follower", CONFIG)
    engine = ShardEngine(follower, replica=None)  # type: ignore[arg-type] - reads only
    entered, release = threading.Event(), threading.Event()
    real_open = statemachine.open_store

    def slow_open(path: Path, memory: bool = False):  # noqa: ANN202 - the old store is closed
        entered.set()
        release.wait(10)
        return real_open(path, memory)

    monkeypatch.setattr(statemachine, "open_store", slow_open)
    install = threading.Thread(target=follower.read_snapshot, args=(str(snapshot),))
    install.start()
    try:
        assert entered.wait(10)
        with pytest.raises(QueueError) as err:
            engine.query(queries.queue_attributes, "orders", WAIT)
        assert err.value.code == "ServiceUnavailable"
    finally:
        release.set()
        install.join(10)
    assert engine.query(queries.queue_attributes, "orders", WAIT) == {
        "ReceiveMessageWaitTimeSeconds": "0"}
    follower.close()


def test_an_install_waits_for_a_read_under_way(tmp_path: Path, snapshot: Path) -> None:
    follower = ShardMachine(tmp_path / "follower", CONFIG)
    follower.apply_entry(1, encode_entry(Entry(1000, (c.CreateQueue("mine"),))))
    install = threading.Thread(target=follower.read_snapshot, args=(str(snapshot),))
    with follower.store.reading():
        rows = follower.store.scan(b"", b"\xff")
        first = next(rows)
        install.start()
        _until(lambda: follower.store._swapping)  # noqa: SLF001 - it waits for this read
        assert first is not None and list(rows) is not None  # the old store is still open
        assert follower.store.get(b"\x00") is None
    install.join(10)
    assert follower.applied_index == 2
    engine = ShardEngine(follower, replica=None)  # type: ignore[arg-type]
    assert isinstance(engine.query(queries.queue_attributes, "orders", WAIT), dict)
    follower.close()
