"""A replica's Raft storage: the hard state replaced whole, and ``RaftStorage`` loading what
a crash at any step of persist, install or compaction left (``storagesupport``). The mutant
test turns the rename into delete-then-rename, as pysyncobj's rewrite in place, and shows
the vote forgotten.
"""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import pytest

from raftgroup import Group
from sqsq.raft import ConfState, Entry, HardState, RaftNode, Ready, SnapshotMeta
from sqsq.shard.hardstate import HardStateError, read_hard_state, write_hard_state
from sqsq.shard.raftlog import SegmentedLog
from sqsq.shard.raftstorage import RaftStorage, StorageError
from storagesupport import Crash, crash, crash_at_step

CONF = ConfState(frozenset({"a", "b", "c"}), frozenset({"d"}))


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
    # The commit is written with the term and vote only (see the next test): 25, not 33.
    assert st.load() == (HardState(2, "a", 25), None,
                         (*entries(1, 30), *entries(31, 35, term=2)))
    st.close()


def test_the_hard_state_is_rewritten_only_for_a_new_term_or_vote(tmp_path: Path) -> None:
    """Term and vote must be durable before anything depends on them; a new commit index
    alone is not worth a file replaced (and fsynced twice) on every Ready."""
    st = storage(tmp_path)
    st.load()
    st.persist(entries(1, 3), HardState(1, "a", 2))
    inode = st.hard_state_path.stat().st_ino  # each write renames a new file in
    st.persist(entries(4, 6), HardState(1, "a", 2))
    st.persist(entries(7, 9), None)
    st.persist((), HardState(1, "a", 9))
    assert st.hard_state_path.stat().st_ino == inode
    st.persist((), HardState(2, None, 9))
    assert st.hard_state_path.stat().st_ino != inode
    inode = st.hard_state_path.stat().st_ino
    st.persist((), HardState(2, "b", 9))
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


@pytest.mark.parametrize("step", range(11))  # 10 steps, then none
def test_a_crash_at_any_step_of_an_install_loads_the_old_state_or_the_new(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    st = storage(tmp_path)
    st.load()
    st.persist(entries(1, 30), HardState(1, "a", 10))
    taken = crash_at_step(monkeypatch, step)
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


# ---- under the consensus core ----------------------------------------------------------------

class StoredNode(RaftNode):
    """A RaftNode whose every Ready is persisted to its RaftStorage before anything in it is
    sent or applied (the host's order)."""

    storage: RaftStorage

    def ready(self) -> Ready:
        rd = super().ready()
        if rd.snapshot is not None:  # from the leader; its data travels beside the message
            self.storage.install_snapshot(rd.snapshot, lambda f: f.write(b"state"))
        self.storage.persist(rd.entries, rd.hard_state)
        return rd


class StoredGroup(Group):
    def __init__(self, root: Path) -> None:
        self.root = root
        super().__init__(("a", "b", "c"))

    def add(self, node_id: str, conf: ConfState | None = None) -> RaftNode:
        storage = RaftStorage(self.root / node_id, segment_bytes=300)
        hs, meta, log = storage.load()
        node = StoredNode(node_id, hard_state=hs, snapshot=meta or SnapshotMeta(0, 0, self.conf),
                          entries=log, rng=random.Random(self.rng.getrandbits(32)),
                          config=self.config, safeguards=self.safeguards)
        node.storage = storage
        self.nodes[node_id] = node
        self.applied[node_id] = []  # a restarted node applies again from its snapshot (none)
        return node

    def restart(self, node_id: str) -> None:
        self.nodes[node_id].storage.close()  # type: ignore[attr-defined]
        self.add(node_id)


def test_the_core_over_real_storage_truncates_a_deposed_leaders_tail_and_restarts_whole(
        tmp_path: Path) -> None:
    g = StoredGroup(tmp_path)
    leader = g.elect("a")
    for i in range(5):
        leader.propose(b"e%d" % i)
    g.flush()
    g.isolate("a")
    leader.propose(b"lost-1")  # persisted by a alone: never committed
    leader.propose(b"lost-2")
    g.flush()
    held = [e.data for e in g.nodes["a"].storage.log.entries()]  # type: ignore[attr-defined]
    assert held[-2:] == [b"lost-1", b"lost-2"]
    g.tick(40, only=["b", "c"])
    new = g.leader()
    assert new is not None and new.id != "a" and new.term > leader.term
    new.propose(b"kept")
    g.flush()
    g.heal()
    g.tick(3)
    on_disk = [e.data for e in g.nodes["a"].storage.log.entries()]  # type: ignore[attr-defined]
    assert b"lost-1" not in on_disk and on_disk[-1] == b"kept"  # truncated at the conflict
    expected = [b"e0", b"e1", b"e2", b"e3", b"e4", b"kept"]
    for node_id in ("a", "b", "c"):
        g.restart(node_id)
    g.tick(40)
    final = g.leader()
    assert final is not None
    final.propose(b"after")
    g.flush()
    g.tick(2)  # the followers learn the last commit with the round after the append's
    for node_id in ("a", "b", "c"):
        assert g.payloads(node_id) == [*expected, b"after"]
        g.nodes[node_id].storage.close()  # type: ignore[attr-defined]


def test_a_follower_behind_the_leaders_compaction_installs_its_snapshot_and_restarts_from_it(
        tmp_path: Path) -> None:
    g = StoredGroup(tmp_path)
    leader = g.elect("a")
    g.isolate("c")
    for i in range(30):
        leader.propose(b"e%d" % i)
    g.flush()
    meta = leader.snapshot_meta(leader.applied)
    storage: RaftStorage = leader.storage  # type: ignore[attr-defined]
    storage.save_snapshot(meta, lambda f: f.write(b"state"))
    leader.compact(meta, keep=2)
    storage.compact(meta.index)
    assert storage.log.first_index() > 1  # whole segments went
    g.heal()
    g.tick(5)
    follower: RaftStorage = g.nodes["c"].storage  # type: ignore[attr-defined]
    latest = follower.latest_snapshot()
    assert latest is not None and latest[0] == meta
    leader.propose(b"after")
    g.flush()
    g.restart("c")
    hs, snap, tail = g.nodes["c"].storage.load()  # type: ignore[attr-defined]
    assert snap == meta and [e.data for e in tail] == [b"after"]
    g.tick(3)
    assert g.nodes["c"].log.last_index() == leader.log.last_index()
    assert g.nodes["c"].log.term(meta.index) == meta.term
    for node in g.nodes.values():
        node.storage.close()  # type: ignore[attr-defined]
