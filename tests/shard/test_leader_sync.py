"""A leader writes its entries and syncs them a moment later (``HostSettings.leader_sync_s``):
its followers' durable copies commit them meanwhile, and it counts its own only once
synced. Three replicas on 127.0.0.1 in one event loop (``test_replica``'s group)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from replicanodes import Node, commit, group, leader, send, state, until
from sqsq.core import commands as c
from sqsq.shard.raftlog import SegmentedLog
from sqsq.shard.replica import HostSettings


async def _stop_all(nodes: list[Node]) -> None:
    for n in nodes:
        if n.replica.core is not None and not n.replica._stopped:
            await n.stop()


def test_a_leaders_entry_commits_on_its_followers_copies_before_its_own_sync(
        tmp_path: Path) -> None:
    """The send is answered while the leader's own copy is written and not yet synced; the
    sync follows within ``leader_sync_s``."""
    async def scenario() -> None:
        nodes = await group(tmp_path, HostSettings(tick_s=0.02, leader_sync_s=2.0))
        try:
            await commit(nodes, c.CreateQueue("q"))
            await commit(nodes, send(1))
            first = leader(nodes)
            assert first is not None and first.replica.core is not None
            core = first.replica.core
            done = core.log.commit
            assert core.log.stable < done  # answered, and not yet synced here
            await until(lambda: core.log.stable >= done)
        finally:
            await _stop_all(nodes)

    asyncio.run(scenario())


def test_a_leader_syncs_each_entry_before_counting_it_when_the_delay_is_zero(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        nodes = await group(tmp_path, HostSettings(tick_s=0.02, leader_sync_s=0.0))
        try:
            await commit(nodes, c.CreateQueue("q"))
            await commit(nodes, send(1))
            first = leader(nodes)
            assert first is not None and first.replica.core is not None
            assert first.replica.core.log.stable >= first.replica.core.log.commit
        finally:
            await _stop_all(nodes)

    asyncio.run(scenario())


def test_a_leader_whose_follower_is_gone_syncs_each_entry_before_counting_it(
        tmp_path: Path) -> None:
    """With one follower of two stopped, an entry commits only with the leader's own copy:
    the first one waits for the delayed sync; after it the leader syncs every Ready (no
    round of writes left for later)."""
    async def scenario() -> None:
        nodes = await group(tmp_path, HostSettings(tick_s=0.02, leader_sync_s=0.5))
        try:
            await commit(nodes, c.CreateQueue("q"))
            first = leader(nodes)
            assert first is not None and first.replica.core is not None
            gone = next(n for n in nodes if n is not first)
            await gone.stop()
            await commit(nodes, send(1))  # committed once the leader synced its copy
            rounds = first.replica._sync_round  # its rounds of writes synced later
            await commit(nodes, send(2))
            assert leader(nodes) is first and first.replica._sync_round == rounds
        finally:
            await _stop_all(nodes)

    asyncio.run(scenario())


def test_a_replica_whose_state_is_ahead_of_its_log_restarts_and_catches_up(
        tmp_path: Path) -> None:
    """What a power cut can leave a leader that applied entries its followers' copies
    committed before its own sync: the state machine has them, its log does not (the
    unsynced tail lost, the applied state kept). It opens, and the group's leader sends it
    the entries again; nothing is applied twice."""
    async def scenario() -> None:
        nodes = await group(tmp_path, HostSettings(tick_s=0.02))
        try:
            await commit(nodes, c.CreateQueue("q"))
            for i in range(5):
                await commit(nodes, send(i))
            first = leader(nodes)
            assert first is not None
            end = first.replica.raftCommitIndex
            await until(lambda: first.machine.applied_index >= end)
            await first.stop()
            log = SegmentedLog(first.root / "shard" / "raft" / "log")
            cut = end - 2
            log._truncate(cut)  # entries cut..end gone from the log, applied in the state
            log.sync()
            assert log.last_index() == cut - 1
            log.close()
            rest = [n for n in nodes if n is not first]
            await commit(rest, send(5))
            await first.start()
            core = first.replica.core
            assert core is not None and first.machine.applied_index >= end > core.log.last_index()
            await commit(nodes, send(6))
            last = leader(nodes).replica.raftCommitIndex  # type: ignore[union-attr]
            await until(lambda: all(n.replica.raftLastApplied >= last for n in nodes))
            assert first.replica.fatal is None and core.log.last_index() >= last
            assert core.log.term(end) is not None
            await until(lambda: len({state(n) for n in nodes}) == 1)
        finally:
            await _stop_all(nodes)

    asyncio.run(scenario())
