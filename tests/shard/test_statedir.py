"""The state directory behind its CURRENT pointer and the snapshot files, through a crash at
each step (``storagesupport``): one state is current and whole, a snapshot is there whole or not
at all. The mutant test deletes the old state before the switch, as pysyncobj's install did
(finding 7), and shows the replica left with none.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import pytest

from sqsq.raft import ConfState, SnapshotMeta
from sqsq.shard import durable, statedir
from sqsq.shard.statedir import SnapshotError, SnapshotStore, StateDir, StateDirError
from storagesupport import DISK_STEPS, Crash, crash, crash_at_step

CONF = ConfState(frozenset({"a", "b", "c"}), frozenset({"d"}))


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


def test_a_first_start_cut_before_the_pointer_was_written_starts_again(tmp_path: Path) -> None:
    (tmp_path / "state" / "state-00000001").mkdir(parents=True)  # made, CURRENT not yet
    sd = StateDir(tmp_path / "state")
    assert sd.current().name == "state-00000001" and not any(sd.current().iterdir())
    assert (tmp_path / "state" / "CURRENT").read_text().strip() == "state-00000001"
