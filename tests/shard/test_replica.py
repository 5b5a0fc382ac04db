"""Shard replicas on sqsq's own Raft, in one event loop: three nodes on 127.0.0.1, each with its
peer transport, Raft storage and RocksDB state. Entries commit on all three; a stopped leader
is replaced and rejoins from its directory; a follower that fell behind the leader's
compaction catches up from a snapshot."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from serverproc import free_port
from sqsq.core import commands as c
from sqsq.core.entry import Entry, encode_entry
from sqsq.core.state import ShardConfig
from sqsq.raft import MsgType
from sqsq.shard.host import TICK_S, Peer, PeerNetwork
from sqsq.shard.peers import PeerTransport
from sqsq.shard.replica import HostSettings, Proposal, RaftReplica
from sqsq.shard.replicas import Replicas
from sqsq.shard.statemachine import ShardMachine

SHARD = 1
SECRET = b"s" * 32
CONFIG = ShardConfig(shard_id=SHARD, secret=SECRET)
TIMEOUT_S = 20.0


class Node:
    bootstrap = True  # a first member of the group

    def __init__(self, root: Path, port: int, members: list[str],
                 settings: HostSettings) -> None:
        self.root, self.port, self.members, self.settings = root, port, members, settings
        self.member = f"127.0.0.1:{port + SHARD}"

    async def start(self) -> None:
        self.replicas = Replicas()
        self.transport = PeerTransport(
            f"127.0.0.1:{self.port}", "127.0.0.1", self.port, SECRET,
            self.replicas.on_messages, self.replicas.on_snapshot,
            snapshot_dir=self.root / "incoming", on_refused=self.replicas.on_refused)
        await self.transport.start()
        self.machine = ShardMachine(self.root / "shard", CONFIG)
        self.replica = RaftReplica(SHARD, self.member, self.root / "shard", self.machine,
                                   self.transport, voters=self.members,
                                   bootstrap=self.bootstrap, settings=self.settings)
        self.replicas.by_shard[SHARD] = self.replica
        await self.replica.start()

    async def stop(self) -> None:
        await self.replica.stop()
        await self.transport.stop()
        self.machine.close()


async def until(done: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not done():
            await asyncio.sleep(0.01)


async def group(tmp_path: Path, settings: HostSettings, kind: type[Node] = Node
                ) -> list[Node]:
    """Three started nodes (``Node`` by default) of one group."""
    ports = [free_port() for _ in range(3)]
    members = [f"127.0.0.1:{p + SHARD}" for p in ports]
    nodes = [kind(tmp_path / f"n{i}", p, members, settings) for i, p in enumerate(ports)]
    for n in nodes:
        await n.start()
    return nodes


def leader(nodes: list[Node]) -> Node | None:
    leaders = [n for n in nodes if n.replica.core is not None and n.replica.is_leader()]
    return leaders[0] if len(leaders) == 1 else None


async def commit(nodes: list[Node], command: object) -> object:
    """Propose at whichever node leads until the command commits; its outcome."""
    async with asyncio.timeout(TIMEOUT_S):
        while True:
            await until(lambda: leader(nodes) is not None)
            node = leader(nodes)
            assert node is not None
            done: asyncio.Future = asyncio.get_running_loop().create_future()
            data = encode_entry(Entry(1_000, (command,)))
            node.replica.propose(data, lambda status, out, done=done: done.done() or
                                 done.set_result((status, out)))
            status, outcomes = await done
            if status is Proposal.COMMITTED:
                return outcomes[0].result
            await asyncio.sleep(0.05)


def state(node: Node) -> object:
    """Everything in the replica's store but its own bookkeeping (the applied index); a
    store being swapped for a snapshot's reads as nothing that equals another."""
    try:
        return tuple(kv for kv in node.machine.store.scan(b"\x00", b"\xff") if kv[0] != b"s")
    except Exception:
        return object()


def send(n: int) -> c.SendMessages:
    return c.SendMessages("q", (c.SendEntry("0", f"body-{n}"),), request_id=f"r{n}",
                          message_ids=(f"m-{n}",))


def test_a_proposal_and_an_append_are_written_and_sent_in_the_call_that_brings_them(
        tmp_path: Path) -> None:
    """An idle leader writes its entry, after sending its appends, before ``propose``
    returns, and a follower writes and answers an append in the callback that delivers it:
    neither waits for its Ready loop's task to get a turn of the event loop."""
    asyncio.run(at_once(tmp_path))


async def at_once(tmp_path: Path) -> None:
    nodes = await group(tmp_path, HostSettings(tick_s=0.02, durable=False))
    try:
        await commit(nodes, send(0))  # a leader, and the group caught up
        lead = leader(nodes)
        assert lead is not None
        seen: list[tuple[int, int, int, int]] = []  # a follower's persists, frames: before, after
        for node in nodes:
            if node is not lead:
                def watched(peer: str, batch: list, node: Node = node,
                            deliver: Callable = node.transport.on_messages) -> None:
                    r, t = node.replica, node.transport
                    before = (r.persists, t.frames_sent)
                    deliver(peer, batch)
                    if any(m.type is MsgType.APPEND and m.entries for _, m in batch):
                        seen.append((*before, r.persists, t.frames_sent))
                node.transport.on_messages = watched  # type: ignore[method-assign]
        persists, frames = lead.replica.persists, lead.transport.frames_sent
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        lead.replica.propose(encode_entry(Entry(1_000, (send(1),))),
                             lambda status, out: done.done() or done.set_result(status))
        assert lead.replica.persists == persists + 1  # its own copy written
        assert lead.transport.frames_sent >= frames + 2  # its appends sent to both
        assert await done is Proposal.COMMITTED
        await until(lambda: len(seen) == 2)
        for persists_before, frames_before, persists_after, frames_after in seen:
            assert persists_after == persists_before + 1  # the entry written
            assert frames_after > frames_before  # and the answer sent
    finally:
        for n in nodes:
            await n.stop()


@pytest.mark.parametrize("settings", [HostSettings(tick_s=0.02)])
def test_entries_commit_on_every_replica_and_survive_a_leader_stopped(
        tmp_path: Path, settings: HostSettings) -> None:
    async def scenario() -> None:
        nodes = await group(tmp_path, settings)
        try:
            assert isinstance(await commit(nodes, c.CreateQueue("q")), c.QueueCreated)
            for i in range(10):
                await commit(nodes, send(i))
            first = leader(nodes)
            assert first is not None
            target = first.replica.raftCommitIndex
            await until(lambda: all(n.machine.applied_index >= target - 1 for n in nodes))
            await first.stop()
            rest = [n for n in nodes if n is not first]
            for i in range(10, 20):
                await commit(rest, send(i))
            assert leader(rest) is not first
            await first.start()  # rejoins from its own directory
            await commit(nodes, send(20))
            end = leader(nodes).replica.raftCommitIndex  # type: ignore[union-attr]
            await until(lambda: all(n.replica.raftLastApplied >= end for n in nodes))
            await until(lambda: len({state(n) for n in nodes}) == 1)
        finally:
            for n in nodes:
                if n.replica.core is not None and not n.replica._stopped:
                    await n.stop()

    asyncio.run(scenario())


def test_a_follower_behind_the_compaction_catches_up_from_a_snapshot(tmp_path: Path) -> None:
    settings = HostSettings(tick_s=0.02, compaction_entries=10, keep_entries=2)

    async def scenario() -> None:
        nodes = await group(tmp_path, settings)
        try:
            await commit(nodes, c.CreateQueue("q"))
            await until(lambda: leader(nodes) is not None)
            lagging = next(n for n in nodes if n is not leader(nodes))
            await lagging.stop()
            rest = [n for n in nodes if n is not lagging]
            # More than the leader's window of appends in flight (which the transport holds
            # for a peer that is away), so the rest must come from a snapshot.
            for i in range(150):
                await commit(rest, send(i))
            assert leader(rest).replica.snapshots_written >= 1  # type: ignore[union-attr]
            await lagging.start()
            await until(lambda: len({state(n) for n in nodes}) == 1)
            installed = lagging.replica.storage.latest_snapshot()
            assert installed is not None and installed[0].index > 2  # from the leader
        finally:
            for n in nodes:
                if not n.replica._stopped:
                    await n.stop()

    asyncio.run(scenario())


def test_a_group_keeps_committing_while_its_replicas_take_their_snapshots(
        tmp_path: Path) -> None:
    """Every replica reaches the snapshot's index together; while their checkpoints run, the
    log is still written, sent and acknowledged (the Ready loop used to wait for them, and
    every caller with it), and no entry is applied under a checkpoint, which must hold
    exactly the snapshot's index."""
    settings = HostSettings(tick_s=0.02, compaction_entries=10, keep_entries=2)
    release = threading.Event()
    seen: list[tuple[int, int]] = []  # the applied index as each checkpoint began and ended

    async def scenario() -> None:
        nodes = await group(tmp_path, settings)
        for n in nodes:
            take = n.machine.write_snapshot

            def slow(path: str, raft: bytes, take=take, machine=n.machine):  # noqa: ANN001
                began = machine.applied_index
                release.wait(TIMEOUT_S)
                pack = take(path, raft)
                seen.append((began, machine.applied_index))
                return pack

            n.machine.write_snapshot = slow  # type: ignore[method-assign]
        try:
            await commit(nodes, c.CreateQueue("q"))
            head = leader(nodes)
            assert head is not None
            answers: list[Proposal] = []
            made: list[int] = []

            def propose(i: int) -> None:
                made.append(i)
                head.replica.propose(encode_entry(Entry(1_000, (send(i),))),  # type: ignore[union-attr]
                                     lambda status, _out: answers.append(status))

            for i in range(20):  # until the leader's snapshot has begun
                propose(i)
                await asyncio.sleep(0.02)
                if head.replica._snapshotting is not None:
                    break
            assert head.replica._snapshotting is not None
            for i in range(20, 25):
                propose(i)
            end = head.replica.core.log.last_index()  # type: ignore[union-attr]
            # committed on a majority while the checkpoints wait
            await until(lambda: head.replica.raftCommitIndex >= end)
            release.set()
            await until(lambda: len(answers) == len(made))
            assert answers == [Proposal.COMMITTED] * len(made)
            await until(lambda: all(n.replica.snapshots_written >= 1 for n in nodes))
            assert seen and all(began == ended for began, ended in seen)
            await until(lambda: len({state(n) for n in nodes}) == 1)
        finally:
            release.set()
            for n in nodes:
                if not n.replica._stopped:
                    await n.stop()

    asyncio.run(scenario())


class QuietNode(Node):
    """A node as a process composes it: one PeerNetwork drives every replica's ticks and the
    node's heartbeat to its peers, and its groups go quiet when idle."""

    async def start(self) -> None:
        self.network = PeerNetwork(Peer("127.0.0.1", 0, self.port), "127.0.0.1", SECRET,
                                   self.root)
        self.transport = self.network.transport
        await self.network.start()
        self.machine = ShardMachine(self.root / "shard", CONFIG)
        self.replica = RaftReplica(SHARD, self.member, self.root / "shard", self.machine,
                                   self.transport, voters=self.members,
                                   bootstrap=self.bootstrap, settings=self.settings,
                                   heard=self.network.heard, ticked_by_host=True)
        self.network.add(self.replica)
        await self.replica.start()

    async def stop(self) -> None:
        await self.replica.stop()
        await self.network.stop()
        self.machine.close()


def test_an_idle_group_goes_quiet_and_still_replaces_a_dead_leader(tmp_path: Path) -> None:
    settings = HostSettings(tick_s=TICK_S, quiesce_after_ticks=10, liveness_s=0.5)

    async def scenario() -> None:
        nodes = await group(tmp_path, settings, QuietNode)
        try:
            await commit(nodes, c.CreateQueue("q"))
            await until(lambda: all(n.replica.core.quiesced for n in nodes))  # type: ignore[union-attr]
            sent = sum(n.transport.messages_sent for n in nodes)
            await asyncio.sleep(20 * TICK_S)  # twenty ticks: heartbeats would have gone
            assert sum(n.transport.messages_sent for n in nodes) == sent
            assert all(n.transport.frames_sent > 0 for n in nodes)  # the nodes' own pings
            old = leader(nodes)
            assert old is not None
            await old.stop()
            rest = [n for n in nodes if n is not old]
            assert isinstance(await commit(rest, send(1)), c.BatchResult)
        finally:
            for n in nodes:
                if not n.replica._stopped:
                    await n.stop()

    asyncio.run(scenario())


def test_a_leader_whose_process_dies_is_replaced_without_waiting_out_a_timeout(
        tmp_path: Path) -> None:
    """Once the group has a leader, its followers' election timeouts are made longer than
    the test: only the refusal of the dead leader's port (the process gone, its listener
    with it) can start an election."""

    async def scenario() -> None:
        nodes = await group(tmp_path, HostSettings(tick_s=0.02))
        try:
            await commit(nodes, c.CreateQueue("q"))
            old = leader(nodes)
            assert old is not None
            rest = [n for n in nodes if n is not old]
            for n in rest:
                n.replica.core.timeout = 1_000_000  # type: ignore[union-attr]
            term = old.replica.raftCurrentTerm
            await old.transport.stop()  # as a kill -9 leaves it: nothing listens, no hand-over
            await old.replica.stop()
            async with asyncio.timeout(5.0):
                await until(lambda: leader(rest) is not None)
            # A later term (term + 1 unless both followers stood at once and split the vote,
            # after which they stand again on ordinary timeouts)
            assert leader(rest).replica.raftCurrentTerm > term  # type: ignore[union-attr]
            assert isinstance(await commit(rest, send(1)), c.BatchResult)
        finally:
            for n in nodes:
                if not n.replica._stopped:
                    await n.stop()

    asyncio.run(scenario())


class Joiner(Node):
    """A new member: an empty directory that joins the group it is given (no bootstrap)."""

    bootstrap = False


def test_a_learner_whose_promotion_gave_up_gets_its_vote_when_added_again(
        tmp_path: Path) -> None:
    # A member is added as a learner and promoted once caught up; a catch-up that outlasts
    # the promotion's tries (a replacement behind a slow link) left it a learner for good,
    # and adding it again was refused (it was a member already): the group had two voters.
    settings = HostSettings(tick_s=0.02)  # the promotion gives up after 200 ticks: 4 s

    async def scenario() -> None:
        nodes = await group(tmp_path, settings)
        new = Joiner(tmp_path / "new", free_port(), nodes[0].members, settings)
        try:
            await commit(nodes, c.CreateQueue("q"))
            first = leader(nodes)
            assert first is not None

            async def add() -> bool:
                done: asyncio.Future = asyncio.get_running_loop().create_future()
                first.replica.change_member(new.member, None,
                                            lambda ok: done.done() or done.set_result(ok))
                return await done

            assert await add() is False  # not running: it never catches up
            assert first.replica.learners() == {new.member}
            await new.start()
            assert await add() is True
            assert first.replica.learners() == frozenset()
            assert new.member in first.replica.members()
        finally:
            for n in [*nodes, new]:
                if getattr(n, "replica", None) is not None and not n.replica._stopped:
                    await n.stop()

    asyncio.run(scenario())


def test_a_leader_cut_off_from_its_group_answers_its_proposals_when_it_stands_down(
        tmp_path: Path) -> None:
    # Check-quorum makes a leader that hears from no follower stand down within three
    # election timeouts (two whole rounds of silence). That step changes no hard state and
    # sends nothing, so no Ready marked it, and proposals made meanwhile were never answered
    # here (the engine gave up after 10 s).
    settings = HostSettings(tick_s=0.02)

    async def scenario() -> None:
        nodes = await group(tmp_path, settings)
        try:
            await commit(nodes, c.CreateQueue("q"))
            first = leader(nodes)
            assert first is not None
            for n in nodes:
                if n is not first:
                    await n.stop()
            done: asyncio.Future = asyncio.get_running_loop().create_future()
            data = encode_entry(Entry(1_000, (send(1),)))
            first.replica.propose(data, lambda status, out: done.done() or
                                  done.set_result(status))
            assert await asyncio.wait_for(done, TIMEOUT_S) is Proposal.UNKNOWN
            assert not first.replica.is_leader()
        finally:
            for n in nodes:
                if not n.replica._stopped:
                    await n.stop()

    asyncio.run(scenario())
