"""A replica's Raft storage around the log: the hard state replaced whole, the state directory
switched by a pointer, snapshot files renamed in whole, and ``RaftStorage`` loading what a
crash at any step of persist, install or compaction left.

A "crash" is an exception raised at one step, after which the files are reopened as they
are. Each safeguard has a mutant test: the same crash with the safeguard switched off (the
rename turned into delete-then-rename, as pysyncobj did) shows the loss.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from sqsq.raft import ConfState, Entry, HardState, SnapshotMeta
from sqsq.shard import durable, raftlog, statedir
from sqsq.shard.hardstate import HardStateError, read_hard_state, write_hard_state
from sqsq.shard.raftlog import SegmentedLog
from sqsq.shard.raftstorage import RaftStorage, StorageError
from sqsq.shard.statedir import SnapshotError, SnapshotStore, StateDir, StateDirError

CONF = ConfState(frozenset({"a", "b", "c"}), frozenset({"d"}))


class Crash(Exception):
    """The process died here."""


def crash(*args: object, **kwargs: object) -> None:
    raise Crash


def entries(lo: int, hi: int, term: int = 1) -> list[Entry]:
    return [Entry(i, term, b"cmd-%d" % i) for i in range(lo, hi + 1)]


def delete_then_rename(src: str | Path, dst: str | Path) -> None:
    """The mutant: the old file removed first, the crash before the new one is renamed in."""
    Path(dst).unlink(missing_ok=True)
    raise Crash


# ---- hard state ------------------------------------------------------------------------------

def test_hard_state_round_trip_and_a_missing_file_is_a_new_replica(tmp_path: Path) -> None:
    path = tmp_path / "hardstate"
    assert read_hard_state(path) == HardState()
    write_hard_state(path, HardState(7, "node-b", 41))
    assert read_hard_state(path) == HardState(7, "node-b", 41)
    write_hard_state(path, HardState(8, None, 41))
    assert read_hard_state(path) == HardState(8, None, 41)


def test_a_leftover_temp_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "hardstate"
    write_hard_state(path, HardState(3, "a", 2))
    (tmp_path / "hardstate.tmp").write_bytes(b"half a write")
    assert read_hard_state(path) == HardState(3, "a", 2)
    write_hard_state(path, HardState(4, "b", 2))  # and the next write goes through
    assert read_hard_state(path) == HardState(4, "b", 2)


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_a_damaged_hard_state_is_an_error_never_an_empty_one(
        tmp_path: Path, damage: str) -> None:
    path = tmp_path / "hardstate"
    write_hard_state(path, HardState(9, "node-c", 5))
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-1] ^= 1
    elif damage == "truncate":
        raw = raw[:-2]
    elif damage == "empty":
        raw = bytearray()
    else:
        raw = bytearray(b"\x04\x00\x00\x00" + b"\xff" * 8)
    path.write_bytes(bytes(raw))
    with pytest.raises(HardStateError, match="vote twice"):
        read_hard_state(path)


def test_a_crash_before_the_rename_keeps_the_old_hard_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "hardstate"
    write_hard_state(path, HardState(5, "node-a", 3))
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(Crash):
        write_hard_state(path, HardState(6, "node-b", 3))
    monkeypatch.undo()
    assert read_hard_state(path) == HardState(5, "node-a", 3)  # the vote in term 5 holds


def test_mutant_a_hard_state_rewritten_in_place_forgets_the_vote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above fails without temp+rename: the replica restarts as new, term 0 and no
    vote, and may vote again in term 5."""
    path = tmp_path / "hardstate"
    write_hard_state(path, HardState(5, "node-a", 3))
    monkeypatch.setattr(os, "replace", delete_then_rename)
    with pytest.raises(Crash):
        write_hard_state(path, HardState(6, "node-b", 3))
    monkeypatch.undo()
    assert read_hard_state(path) == HardState()  # amnesia


def test_the_hard_state_is_fsynced_renamed_and_its_directory_fsynced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        steps.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", lambda a, b: (steps.append("rename"),
                                                     real_replace(a, b))[1])
    write_hard_state(tmp_path / "hardstate", HardState(1, "a", 0))
    assert steps == ["fsync file", "rename", "fsync dir"]  # content, then name, then rename
    monkeypatch.undo()
    assert read_hard_state(tmp_path / "hardstate") == HardState(1, "a", 0)


# ---- state directory -------------------------------------------------------------------------

def fill(directory: Path, tag: str) -> None:
    (directory / "CURRENT").write_text(tag)  # as RocksDB's own files are
    (directory / "000001.sst").write_bytes(tag.encode() * 1000)
    (directory / "sub").mkdir()
    (directory / "sub" / "x").write_text(tag)


def contents(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def state_with_old(tmp_path: Path) -> tuple[StateDir, Path, dict[str, bytes]]:
    sd = StateDir(tmp_path / "state")
    old = sd.current()
    fill(old, "old")
    return sd, old, contents(old)


def test_a_new_state_dir_and_a_committed_stage(tmp_path: Path) -> None:
    sd, old, _ = state_with_old(tmp_path)
    assert old.is_dir() and (tmp_path / "state" / "CURRENT").read_text().strip() == old.name
    staged = sd.stage()
    fill(staged, "new")
    expected = contents(staged)
    new = sd.commit(staged)
    assert sd.current() == new and contents(new) == expected and not old.exists()
    assert StateDir(tmp_path / "state").current() == new
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["CURRENT", new.name]


def test_a_crash_after_staging_before_the_switch_keeps_the_old_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sd, old, before = state_with_old(tmp_path)
    staged = sd.stage()
    fill(staged, "new")
    monkeypatch.setattr(statedir, "atomic_write", crash)  # the pointer's switch
    with pytest.raises(Crash):
        sd.commit(staged)
    monkeypatch.undo()
    reopened = StateDir(tmp_path / "state")
    assert reopened.current() == old and contents(old) == before
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["CURRENT", old.name]


def test_mutant_an_install_that_deletes_the_old_state_first_leaves_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above fails when the old state goes before the switch (pysyncobj's install,
    finding 7): the replica cannot open."""

    def delete_first_commit(self: StateDir, staged: Path) -> Path:
        durable.remove_tree(self.current())
        raise Crash  # before the rename and the switch

    monkeypatch.setattr(StateDir, "commit", delete_first_commit)
    sd, old, _ = state_with_old(tmp_path)
    staged = sd.stage()
    fill(staged, "new")
    with pytest.raises(Crash):
        sd.commit(staged)
    monkeypatch.undo()
    with pytest.raises(StateDirError, match="not a state directory"):
        StateDir(tmp_path / "state")


def test_a_crash_after_the_switch_keeps_the_new_state_and_cleans_the_old(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sd, old, _ = state_with_old(tmp_path)
    staged = sd.stage()
    fill(staged, "new")
    expected = contents(staged)
    monkeypatch.setattr(statedir, "remove_tree", crash)
    with pytest.raises(Crash):
        sd.commit(staged)
    monkeypatch.undo()
    assert old.exists()
    reopened = StateDir(tmp_path / "state")
    assert reopened.current() != old and contents(reopened.current()) == expected
    assert not old.exists()


def test_a_staged_tree_is_fsynced_before_the_switch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sd, _, _ = state_with_old(tmp_path)
    staged = sd.stage()
    fill(staged, "new")
    steps: list[str] = []
    real_tree, real_write = statedir.fsync_tree, statedir.atomic_write
    monkeypatch.setattr(statedir, "fsync_tree",
                        lambda p: (steps.append("fsync tree"), real_tree(p))[1])
    monkeypatch.setattr(statedir, "atomic_write",
                        lambda p, d: (steps.append("switch"), real_write(p, d))[1])
    sd.commit(staged)
    assert steps == ["fsync tree", "switch"]


def test_state_dirs_without_a_pointer_are_an_error_not_a_new_replica(tmp_path: Path) -> None:
    sd, old, before = state_with_old(tmp_path)
    (tmp_path / "state" / "CURRENT").unlink()
    with pytest.raises(StateDirError, match="no CURRENT"):
        StateDir(tmp_path / "state")
    assert contents(old) == before  # nothing cleaned up


# ---- snapshot files ------------------------------------------------------------------------

def test_snapshots_round_trip_and_only_the_newest_are_kept(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps", keep=2)
    assert store.latest() is None
    for index in (10, 20, 30):
        store.save(SnapshotMeta(index, 2, CONF), lambda f, i=index: f.write(b"data-%d" % i))
    latest = store.latest()
    assert latest is not None and latest[0] == SnapshotMeta(30, 2, CONF)
    with store.open_data(latest[1]) as f:
        assert f.read() == b"data-30"
    assert len(list((tmp_path / "snaps").iterdir())) == 2


def test_a_snapshot_cut_short_by_a_crash_is_not_there(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    store.save(SnapshotMeta(10, 1, CONF), lambda f: f.write(b"old"))

    def half_then_crash(f: BinaryIO) -> None:
        f.write(b"half")
        raise Crash

    with pytest.raises(Crash):
        store.save(SnapshotMeta(20, 1, CONF), half_then_crash)
    (tmp_path / "snaps" / f"{20:020d}-{1:020d}.snap.tmp").write_bytes(b"a killed save")
    store = SnapshotStore(tmp_path / "snaps")
    latest = store.latest()
    assert latest is not None and latest[0].index == 10
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "snaps").iterdir())


def test_a_damaged_snapshot_header_is_an_error(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    path = store.save(SnapshotMeta(10, 1, CONF), lambda f: f.write(b"data"))
    raw = bytearray(path.read_bytes())
    raw[20] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(SnapshotError, match="damaged snapshot header"):
        store.latest()


# ---- RaftStorage -----------------------------------------------------------------------------

def storage(tmp_path: Path) -> RaftStorage:
    return RaftStorage(tmp_path / "replica", segment_bytes=256)


def test_a_new_replica_loads_nothing_and_what_is_persisted_loads_back(tmp_path: Path) -> None:
    st = storage(tmp_path)
    assert st.load() == (HardState(), None, ())
    st.persist(entries(1, 30), HardState(2, "a", 25))
    st.persist(entries(31, 35, term=2), HardState(2, "a", 33))
    st.close()
    st = storage(tmp_path)
    assert st.load() == (HardState(2, "a", 33), None,
                         (*entries(1, 30), *entries(31, 35, term=2)))
    st.close()


def test_an_unchanged_hard_state_is_not_rewritten(tmp_path: Path) -> None:
    st = storage(tmp_path)
    st.load()
    st.persist(entries(1, 3), HardState(1, "a", 2))
    inode = st.hard_state_path.stat().st_ino  # each write renames a new file in
    st.persist(entries(4, 6), HardState(1, "a", 2))
    st.persist(entries(7, 9), None)
    assert st.hard_state_path.stat().st_ino == inode
    st.persist((), HardState(1, "a", 9))
    assert st.hard_state_path.stat().st_ino != inode
    st.close()


def test_a_commit_past_the_logs_end_is_an_error(tmp_path: Path) -> None:
    st = storage(tmp_path)
    st.load()
    st.persist(entries(1, 5), HardState(1, "a", 5))
    st.close()
    write_hard_state(tmp_path / "replica" / "hardstate", HardState(1, "a", 9))
    with pytest.raises(StorageError, match="commit 9 is past the log's end 5"):
        storage(tmp_path).load()


def test_compaction_keeps_the_snapshots_own_entry_and_loads_after_it(tmp_path: Path) -> None:
    st = storage(tmp_path)
    st.load()
    st.persist(entries(1, 60), HardState(1, "a", 60))
    st.compact(50)  # no snapshot yet: nothing else holds these entries
    assert st.log.first_index() == 1
    st.save_snapshot(SnapshotMeta(40, 1, CONF), lambda f: f.write(b"state@40"))
    st.compact(50)
    assert 1 < st.log.first_index() <= 40 and st.log.term(40) == 1
    st.close()
    st = storage(tmp_path)
    hs, meta, tail = st.load()
    assert meta == SnapshotMeta(40, 1, CONF) and tail == tuple(entries(41, 60))
    st.close()


def test_a_log_that_starts_past_the_snapshot_is_an_error(tmp_path: Path) -> None:
    st = storage(tmp_path)
    st.load()
    st.persist(entries(1, 60), HardState(1, "a", 60))
    st.save_snapshot(SnapshotMeta(40, 1, CONF), lambda f: f.write(b"state@40"))
    st.compact(50)
    st.close()
    for p in (tmp_path / "replica" / "snapshots").iterdir():
        p.unlink()  # the snapshot lost: the compacted entries are nowhere
    with pytest.raises(StorageError, match="are nowhere"):
        storage(tmp_path).load()


def test_an_install_cut_short_before_the_log_reset_is_finished_on_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = storage(tmp_path)
    st.load()
    st.persist(entries(1, 30), HardState(1, "a", 10))  # 11..30 from a deposed leader
    monkeypatch.setattr(SegmentedLog, "reset", crash)
    with pytest.raises(Crash):
        st.install_snapshot(SnapshotMeta(20, 3, CONF), lambda f: f.write(b"state@20"))
    monkeypatch.undo()
    st.close()
    st = storage(tmp_path)
    assert st.log.entries(after=20) == entries(21, 30)  # the stale tail is still on disk
    hs, meta, tail = st.load()
    assert meta == SnapshotMeta(20, 3, CONF) and tail == ()  # and the load drops it
    assert st.log.term(20) == 3
    st.persist(entries(21, 22, term=3), HardState(3, "a", 21))
    st.close()
    st = storage(tmp_path)
    assert st.load()[2] == tuple(entries(21, 22, term=3))
    st.close()


def test_an_installed_snapshot_replaces_the_log(tmp_path: Path) -> None:
    st = storage(tmp_path)
    st.load()
    st.persist(entries(1, 30), HardState(1, "a", 10))
    st.install_snapshot(SnapshotMeta(100, 4, CONF), lambda f: f.write(b"state@100"))
    st.persist(entries(101, 103, term=4), HardState(4, None, 100))
    st.close()
    st = storage(tmp_path)
    assert st.load() == (HardState(4, None, 100), SnapshotMeta(100, 4, CONF),
                         tuple(entries(101, 103, term=4)))
    st.close()


# ---- a crash at every step ---------------------------------------------------------------

def crash_at_step(monkeypatch: pytest.MonkeyPatch, step: int,
                  targets: list[tuple[object, str]]) -> list[str]:
    """Each call of a target (a write, sync, rename, unlink) is a step; the ``step``-th
    raises Crash. Returns the steps taken, named."""
    taken: list[str] = []
    for owner, name in targets:
        real = getattr(owner, name)

        def wrapper(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            if len(taken) == step:
                raise Crash
            taken.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)
    return taken


DISK_STEPS = [(os, "fsync"), (os, "fdatasync"), (os, "replace"), (os, "rename"),
              (os, "ftruncate"), (Path, "unlink"), (raftlog, "write_all")]


@pytest.mark.parametrize("step", range(11))  # 10 steps, then none
def test_a_crash_at_any_step_of_an_install_loads_the_old_state_or_the_new(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    st = storage(tmp_path)
    st.load()
    st.persist(entries(1, 30), HardState(1, "a", 10))
    taken = crash_at_step(monkeypatch, step, DISK_STEPS)
    try:
        st.install_snapshot(SnapshotMeta(20, 3, CONF), lambda f: f.write(b"state@20"))
    except Crash:
        pass
    monkeypatch.undo()
    assert step < 10 or len(taken) == 10  # the last case ran the install whole
    st.close()
    st = storage(tmp_path)
    assert st.load() in ((HardState(1, "a", 10), None, tuple(entries(1, 30))),
                         (HardState(1, "a", 10), SnapshotMeta(20, 3, CONF), ()))
    st.close()


@pytest.mark.parametrize("step", range(13))  # 12 steps, then none
def test_a_crash_at_any_step_of_a_state_switch_leaves_one_state_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    sd, old, before = state_with_old(tmp_path)
    staged = sd.stage()
    fill(staged, "new")
    after = contents(staged)
    taken = crash_at_step(monkeypatch, step, [*DISK_STEPS, (statedir, "remove_tree")])
    try:
        sd.commit(staged)
    except Crash:
        pass
    monkeypatch.undo()
    assert step < 12 or len(taken) == 12
    reopened = StateDir(tmp_path / "state")
    assert contents(reopened.current()) in (before, after)
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [
        "CURRENT", reopened.current().name]
