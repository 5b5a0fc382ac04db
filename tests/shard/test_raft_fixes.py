"""One regression test per pysyncobj 0.3.17 hole that ``sqsq.shard.raft`` fixes; each fails
without its fix. Replicas run in this process, ticked by the test under a fake clock."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import msgpack
import pysyncobj.pickle
import pytest
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.node import TCPNode

from raftsupport import RecordingMachine, free_port, raft_group
from sqsq.shard import raft
from sqsq.shard.dumps import BackgroundSerializer
from sqsq.shard.raft import MEMBER_FILE, Proposal, RaftSettings, ShardReplica


def test_nothing_is_acknowledged_or_counted_before_it_is_on_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fix 1: a follower answers an append only once its journal is synced through it, and a
    leader commits only entries its own journal has synced."""
    acks: list[tuple[str, int, int]] = []
    send = raft._Transport.send  # noqa: SLF001

    def spy(self, node, message):  # noqa: ANN001, ANN202
        result = send(self, node, message)
        if message.get("type") == "next_node_idx" and message.get("success"):
            journal = self._replica.journal
            acks.append((self._replica.settings.self_address, message["next_node_idx"] - 1,
                         journal.synced_index))
        return result

    monkeypatch.setattr(raft._Transport, "send", spy)  # noqa: SLF001
    with raft_group(tmp_path, monkeypatch) as group:
        leader = group.elect()
        for i in range(20):
            box = group.propose(leader, b"m%d" % i)
            while not box:
                group.step(0.01)
                for r in group.replicas.values():
                    if r.is_leader():
                        assert r.raftCommitIndex <= r.journal.synced_index
            assert box[0][0] is Proposal.COMMITTED
        assert acks, "no follower acknowledged anything"
        for who, acked, synced in acks:
            assert acked <= synced, f"{who} acknowledged index {acked} with {synced} on disk"


def _regular(replica: ShardReplica, data: bytes) -> bytes:
    """An entry as pysyncobj logs a call of the replicated method."""
    func_id = replica._methodToID[replica._getFuncName("_entry")]  # noqa: SLF001
    return b"\x00" + pysyncobj.pickle.dumps((func_id, (data,)))


def test_a_snapshot_chunk_does_not_commit_a_deposed_leaders_tail(tmp_path: Path) -> None:
    """Fix 2: entries appended in an old term and never committed are not applied (nor
    acknowledged) because a snapshot chunk from a new leader carries a high commit index."""
    me, old, new = (f"127.0.0.1:{free_port()}" for _ in range(3))
    machine = RecordingMachine()
    replica = ShardReplica(RaftSettings(me, [me, old, new], tmp_path, bootstrap=True,
                                        auto_tick=False), machine)
    try:
        transport = replica._SyncObj__transport  # noqa: SLF001
        tail = [(_regular(replica, b"uncommitted-%d" % i), 2 + i, 1) for i in range(3)]
        transport._onMessageReceived(TCPNode(old), {  # noqa: SLF001
            "type": "append_entries", "term": 1, "commit_index": 1, "prevLogIdx": 1,
            "prevLogTerm": 0, "entries": tail})
        transport._onMessageReceived(TCPNode(new), {  # noqa: SLF001
            "type": "append_entries", "term": 2, "commit_index": 50,
            "serialized": (b"partial snapshot", True, False)})
        for _ in range(5):
            replica.doTick(0.0)
        assert replica.raftCommitIndex == 1
        assert machine.applied == []
    finally:
        replica._doDestroy()  # noqa: SLF001


def test_a_full_restart_after_compaction_keeps_the_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fix 3: with the journal compacted, every replica restarted comes back with what it had
    applied (its dump holds the state machine), and the group goes on."""
    with raft_group(tmp_path, monkeypatch) as group:
        leader = group.elect()
        for i in range(12):
            assert group.commit(leader, b"m%d" % i) is Proposal.COMMITTED
        group.run(0.3)
        for r in group.replicas.values():
            r.forceLogCompaction()
        group.run(0.3)
        assert all(len(r.journal) < 12 for r in group.replicas.values()), "no compaction"
        for address in list(group.replicas):
            group.destroy(address)
        for address in group.addresses:  # fresh machines: only the dump can restore them
            group.start(address, bootstrap=False)
        leader = group.elect()
        for address, replica in group.replicas.items():  # the dump's members, less itself
            assert sorted(n.id for n in replica.otherNodes) == sorted(
                a for a in group.addresses if a != address)
        assert group.commit(leader, b"after") is Proposal.COMMITTED
        group.run(0.5)
        want = [b"m%d" % i for i in range(12)] + [b"after"]
        for address, machine in group.machines.items():
            assert machine.payloads()[-13:] == want, address


def test_an_apply_that_raises_stops_the_replica(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fix 4: an exception in apply stops the replica at once (on_fatal), instead of being
    retried on every tick forever."""
    with raft_group(tmp_path, monkeypatch) as group:
        leader = group.elect()
        for machine in group.machines.values():
            machine.fail_on = b"poison"
        box = group.propose(leader, b"poison")
        group.run(1.0)
        # Every replica that learns the entry is committed stops once, at its first try (the
        # leader first; a follower may never hear of the commit from a stopped leader).
        assert group.replicas[leader].fatal is not None
        stopped = [r for r in group.replicas.values() if r.fatal is not None]
        assert len(group.fatal) == len(stopped)
        assert not box or box[0][0] is not Proposal.COMMITTED
        assert all(b"poison" not in m.payloads() for m in group.machines.values())


def test_a_deposed_leader_does_not_acknowledge_what_the_next_leader_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fix 5: the old leader's entry reached one follower, which then led and committed it;
    the old leader, healed, applies it in the term it proposed in, but it no longer leads:
    outcome unknown, not success (its client retries with the same request id)."""
    with raft_group(tmp_path, monkeypatch) as group:
        old = group.elect()
        f1, f2 = (a for a in group.addresses if a != old)
        box = group.propose(old, b"x")
        group.stopped.add(f2)
        group.replicas[old].doTick(0.0)  # appends x and sends it
        for _ in range(20):
            group.replicas[f1].doTick(0.0)  # f1 appends x and acknowledges it
        group.cut.add(old)  # ... before the old leader hears of the acknowledgement
        group.stopped.clear()
        group.run(3.0)
        assert group.leaders() == [f1]
        group.cut.clear()
        group.run(2.0)
        assert all(m.payloads() == [b"x"] for m in group.machines.values())
        assert box and box[0][0] is Proposal.UNKNOWN


def test_a_leader_on_an_island_acknowledges_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader cut off from its followers acknowledges nothing it proposed there, and once
    healed it holds the new leader's log, not its own."""
    with raft_group(tmp_path, monkeypatch) as group:
        old = group.elect()
        assert group.commit(old, b"before") is Proposal.COMMITTED
        group.cut.add(old)
        stale = group.propose(old, b"on the island")
        group.run(3.0)
        new = group.leaders()[0]
        assert new != old
        assert group.commit(new, b"after") is Proposal.COMMITTED
        group.cut.clear()
        group.run(2.0)
        assert stale and stale[0][0] is not Proposal.COMMITTED
        for machine in group.machines.values():
            assert machine.payloads() == [b"before", b"after"]


def test_a_wiped_replica_learns_before_it_votes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fix 6: a replica whose directory is new, not bootstrapping, answers no vote request
    until it has caught up; then it records a vote for the current term and is a member."""
    with raft_group(tmp_path, monkeypatch) as group:
        leader = group.elect()
        for i in range(5):
            assert group.commit(leader, b"m%d" % i) is Proposal.COMMITTED
        wiped = next(a for a in group.addresses if a != leader)
        group.destroy(wiped)
        directory = tmp_path / wiped.replace(":", "_")
        for p in sorted(directory.iterdir(), reverse=True):
            p.unlink() if p.is_file() else None
        replica = group.start(wiped, bootstrap=False)
        assert replica.learner
        votes = []
        send = raft._Transport.send  # noqa: SLF001
        monkeypatch.setattr(raft._Transport, "send", lambda self, node, message: (  # noqa: SLF001
            votes.append(message) if message.get("type") == "response_vote" else None,
            send(self, node, message))[1])
        replica._SyncObj__transport._onMessageReceived(TCPNode(leader), {  # noqa: SLF001
            "type": "request_vote", "term": 99, "last_log_index": 1000, "last_log_term": 99})
        assert votes == [] and replica.raftCurrentTerm < 99
        group.run(2.0)
        assert not replica.learner
        assert (directory / MEMBER_FILE).exists()
        assert group.machines[wiped].payloads() == [b"m%d" % i for i in range(5)]
        assert replica._SyncObj__votedForNodeId == raft.WIPED_VOTE  # noqa: SLF001


def test_a_leader_writing_a_snapshot_goes_on_leading_and_committing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fix 7: while a snapshot's file is being written (here: held until the test lets it
    go), the leader's tick goes on: it commits, its followers hear from it and elect no one
    else; the journal is compacted only once the dump is on disk, and it holds the state."""
    release = threading.Event()

    def slow_dump(self: RecordingMachine, path: str, raft_data: bytes):  # noqa: ANN202
        state = msgpack.packb([self.applied_index, [list(a) for a in self.applied],
                               raft_data], use_bin_type=True)  # as of this entry

        def write_file() -> None:
            assert release.wait(30), "the test never let the dump be written"
            Path(path).write_bytes(state)
        return write_file

    monkeypatch.setattr(RecordingMachine, "write_snapshot", slow_dump)
    with raft_group(tmp_path, monkeypatch) as group:
        leader = group.elect()
        replica = group.replicas[leader]
        term = replica.raftCurrentTerm
        for i in range(12):
            assert group.commit(leader, b"m%d" % i) is Proposal.COMMITTED
        replica.forceLogCompaction()
        group.run(0.1)
        serializer = replica._SyncObj__serializer  # noqa: SLF001
        assert serializer.checkSerializing()[0] == SERIALIZER_STATE.SERIALIZING
        group.run(3.0)  # fake time: well past every follower's election timeout
        assert group.leaders() == [leader] and replica.raftCurrentTerm == term
        assert group.commit(leader, b"during") is Proposal.COMMITTED
        assert len(replica.journal) > 12, "compacted before the dump was written"
        assert replica.snapshots_written == 0
        release.set()
        assert serializer.wait(30)
        group.run(0.1)
        assert len(replica.journal) < 12, "not compacted once the dump was written"
        dump = Path(replica.settings.directory / "raft.dump")
        assert replica.snapshots_written == 1
        assert replica.snapshot_bytes == dump.stat().st_size
        index, applied, _ = msgpack.unpackb(Path(replica.settings.directory / "raft.dump")
                                            .read_bytes(), raw=False)
        assert [bytes(d) for _, d in applied][-12:] == [b"m%d" % i for i in range(12)]


def test_a_dump_from_the_leader_wins_over_the_one_being_written(tmp_path: Path) -> None:
    """Fix 7: a follower's own dump still being written when the leader's arrives must not
    replace it afterwards (it is older), nor count as written."""
    dump = tmp_path / "raft.dump"
    release = threading.Event()

    def serializer(tmp: str, raft_data: object):  # noqa: ANN202
        def write_file() -> None:
            release.wait(30)
            Path(tmp).write_bytes(b"ours, older")
        return write_file

    s = BackgroundSerializer(str(dump), 1024, True, serializer, None, None)
    s.serialize((None, "last", "prev", "members"), 7)
    assert s.checkSerializing() == (SERIALIZER_STATE.SERIALIZING, 7)
    assert s.setTransmissionData((b"the leader's", True, True))
    release.set()
    assert s.wait(30)
    assert dump.read_bytes() == b"the leader's"
    assert s.checkSerializing() == (SERIALIZER_STATE.FAILED, 7)
    assert s.written == 0  # not counted as a snapshot of ours (metrics)
    assert not (tmp_path / "raft.dump.tmp").exists()


def test_a_follower_keeps_the_entries_an_append_repeats(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Fix 8: an append that repeats entries a follower holds (a leader re-sending after a
    reset) does not cut the follower's log after them; it is answered for what it covers,
    commits no further, and an entry that conflicts still truncates."""
    me, leader, other = (f"127.0.0.1:{free_port()}" for _ in range(3))
    machine = RecordingMachine()
    replica = ShardReplica(RaftSettings(me, [me, leader, other], tmp_path, bootstrap=True,
                                        auto_tick=False), machine)
    answers: list[dict] = []
    monkeypatch.setattr(raft.TCPTransport, "send",
                        lambda self, node, message: answers.append(message) or True)
    try:
        transport = replica._SyncObj__transport  # noqa: SLF001
        log = [(_regular(replica, b"m%d" % i), i, 1) for i in range(2, 12)]

        def append(sender: str, term: int, prev: int, prev_term: int, entries: list,
                   commit: int) -> dict:
            answers.clear()
            transport._onMessageReceived(TCPNode(sender), {  # noqa: SLF001
                "type": "append_entries", "term": term, "commit_index": commit,
                "prevLogIdx": prev, "prevLogTerm": prev_term, "entries": entries})
            for _ in range(3):
                replica.doTick(0.0)
            return next(a for a in answers if a["type"] == "next_node_idx")

        assert append(leader, 1, 1, 0, log, commit=9)["next_node_idx"] == 12
        assert replica.raftCommitIndex == 9

        answer = append(leader, 1, 5, 1, log[4:6], commit=11)  # entries 6 and 7 again
        assert (answer["success"], answer["next_node_idx"]) == (True, 8)
        assert [e[1] for e in replica.journal[-5:]] == [7, 8, 9, 10, 11]
        assert replica.raftCommitIndex == 9  # 10 and 11 were not vouched for by that append
        assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]

        answer = append(leader, 1, 7, 1, [], commit=11)  # a heartbeat from behind
        assert (answer["success"], answer["next_node_idx"]) == (True, 8)
        assert replica.journal[-1][1] == 11

        assert append(leader, 1, 11, 1, [], commit=11)["next_node_idx"] == 12
        assert replica.raftCommitIndex == 11
        assert [i for i, _ in machine.applied] == list(range(2, 12))

        # A new leader whose entry 12 differs from one this replica appended uncommitted.
        append(leader, 1, 11, 1, [(_regular(replica, b"stale"), 12, 1)], commit=11)
        answer = append(other, 2, 11, 1, [(_regular(replica, b"new"), 12, 2)], commit=11)
        assert (answer["success"], answer["next_node_idx"]) == (True, 13)
        assert (replica.journal[-1][1], replica.journal[-1][2]) == (12, 2)
    finally:
        replica._doDestroy()  # noqa: SLF001


def test_a_leader_hands_over_to_a_caught_up_follower_within_an_election_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``transfer_leadership`` (a graceful stop's hand-over): the chosen follower with the
    whole log (``pick``, in address order) leads in the next term well before any election
    timeout could have passed, the old leader follows it, and what was committed stays
    committed."""
    lo, _hi = RaftSettings("x", ["x"], tmp_path).election_timeout_s
    with raft_group(tmp_path, monkeypatch) as group:
        leader = group.elect()
        for i in range(5):
            assert group.commit(leader, b"m%d" % i) is Proposal.COMMITTED
        for pick in (1, 0, 2):
            group.run(0.2)  # heartbeats: every follower reports the whole log
            old, term = leader, group.replicas[leader].raftCurrentTerm
            followers = sorted(a for a in group.addresses if a != old)
            group.replicas[old].transfer_leadership(pick)

            def moved(old: str = old) -> bool:  # a new leader, and the old one follows it
                leaders = group.leaders()
                return len(leaders) == 1 and leaders[0] != old and \
                    group.replicas[old].leader_address() == leaders[0]

            waited = 0.0
            while waited < lo / 2 and not moved():
                group.step(0.01)
                waited += 0.01
            assert moved(), f"no hand-over within {lo / 2}s of fake time"
            [leader] = group.leaders()
            assert leader == followers[pick % 2]
            assert group.replicas[leader].raftCurrentTerm == term + 1
        assert group.commit(leader, b"after") is Proposal.COMMITTED
        group.run(0.2)
        for machine in group.machines.values():
            assert machine.payloads()[-6:] == [b"m0", b"m1", b"m2", b"m3", b"m4", b"after"]
