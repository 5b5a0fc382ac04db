"""A node agent's leader hints, against a real etcd, over replicas that stand in for Raft
groups: what it publishes, when it publishes again, and that a steady pass skips the work."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from etcdproc import EtcdProcess
from sqsq.control import keys
from sqsq.control.agent import NodeAgent
from sqsq.control.balance import BUSY_AT, ENV_BUSY_AT, busy_after, busy_at
from sqsq.control.controller import ControllerSettings
from sqsq.control.etcd import Etcd, KeyValue
from sqsq.control.keys import LeaderHint, NodeRecord, ShardRecord
from sqsq.control.lease import Lease
from sqsq.control.partition_map import (
    change_replicas,
    create_shard,
    register_node,
)

NODES = {n: NodeRecord(n, f"127.0.0.1:{7400 + i}", f"127.0.0.1:{7500 + 100 * i}")
         for i, n in enumerate("abcd")}


def raft(node: str, shard_id: int = 0) -> str:
    return NODES[node].raft_for(shard_id)


class FakeShard:
    """A replica as the agent sees one: whether it leads and in which term, its members."""

    def __init__(self, members: set[str]) -> None:
        self.term: int | None = None
        self.members_ = frozenset(members)
        self.learners_: frozenset[str] = frozenset()
        self.changes: list[tuple[str | None, str | None]] = []

    def leading_term(self) -> int | None:
        return self.term

    def members(self) -> frozenset[str]:
        return self.members_

    def learners(self) -> frozenset[str]:
        return self.learners_

    async def change_member(self, add: str | None = None,
                            remove: str | None = None) -> bool:
        self.changes.append((add, remove))
        if remove is not None:
            self.members_ -= {remove}
        elif add is not None:
            self.members_ |= {add}
            self.learners_ -= {add}  # caught up at once
        return True

    async def hand_over(self, pick: int = 0, timeout_s: float = 2.0,
                        to: str | None = None) -> str | None:
        return None


Scenario = Callable[[Etcd, NodeAgent, FakeShard, list[Lease]], Awaitable[None]]


def run(etcd_proc: EtcdProcess, scenario: Scenario) -> None:
    """Node a's agent, started, hosting shard 0 (replicas a, b, c; b, c and d registered
    under a lease of the test's) through a ``FakeShard`` that leads in term 3."""
    async def main() -> None:
        async with Etcd(etcd_proc.endpoint) as etcd:
            leases = []
            for node in "bcd":
                lease = await Lease.grant(etcd, 30)
                await etcd.put(keys.member_key(node), keys.encode(NODES[node]))
                await register_node(etcd, NODES[node], lease)
                leases.append(lease)
            await create_shard(etcd, ShardRecord(0, ("a", "b", "c"), 1))
            shard = FakeShard({raft("a"), raft("b"), raft("c")})
            shard.term = 3

            async def open_shard(shard_id: int, peers: list[NodeRecord],
                                 bootstrap: bool) -> FakeShard:
                return shard

            agent = NodeAgent(etcd, NODES["a"], open_shard, ControllerSettings(shards=1),
                              lease_ttl_s=10)
            await agent.start()
            try:
                await scenario(etcd, agent, shard, leases)
            finally:
                await agent.close()
                for lease in leases:
                    await lease.revoke()

    asyncio.run(asyncio.wait_for(main(), 60))


async def hint(etcd: Etcd, pred: Callable[[LeaderHint], bool]) -> LeaderHint:
    """Shard 0's hint as etcd has it (what a gateway reads), once ``pred`` holds for it."""
    return keys.decode_leader((await hint_kv(etcd, lambda kv: pred(
        keys.decode_leader(kv.value)))).value)


async def hint_kv(etcd: Etcd, pred: Callable[[KeyValue], bool]) -> KeyValue:
    """Shard 0's hint key, read from etcd until ``pred`` holds for it."""
    for _ in range(400):
        kv = await etcd.get(keys.leader_key(0))
        if kv is not None and pred(kv):
            return kv
        await asyncio.sleep(0.05)
    raise AssertionError("no such hint was published")


async def steady(agent: NodeAgent) -> None:
    """Wait until a pass over the shards finds nothing to do (the map has caught up with
    what the agent published): a pass that skips ``_lead_shard``."""
    for _ in range(200):
        calls = count_leads(agent)
        await agent.publish_hints_once()
        del agent._lead_shard  # back to the method
        if not calls:
            return
        await asyncio.sleep(0.05)  # the watch brings the agent's own write
    raise AssertionError("the agent never found its shard steady")


def count_leads(agent: NodeAgent) -> list[int]:
    """The shards the agent's passes work on from now on (``_lead_shard`` calls)."""
    calls: list[int] = []
    real = agent._lead_shard

    async def counting(shard_id: int, hosted: FakeShard) -> None:
        calls.append(shard_id)
        await real(shard_id, hosted)

    agent._lead_shard = counting  # type: ignore[method-assign]
    return calls


def test_a_steady_leader_is_passed_over_and_a_new_term_publishes_a_new_hint(
        etcd_proc: EtcdProcess) -> None:
    async def scenario(etcd: Etcd, agent: NodeAgent, shard: FakeShard,
                       leases: list[Lease]) -> None:
        first = await hint(etcd, lambda h: True)
        assert (first.node_id, first.term, first.epoch) == ("a", 3, 1)
        await steady(agent)
        calls = count_leads(agent)
        for _ in range(3):
            await agent.publish_hints_once()
        assert calls == []  # the memo: nothing it read changed
        shard.term = 7  # elected again, in a later term
        await agent.publish_hints_once()
        assert 0 in calls
        assert (await hint(etcd, lambda h: h.term == 7)).node_id == "a"

    run(etcd_proc, scenario)


def test_a_lost_lease_and_a_deleted_hint_are_published_again(etcd_proc: EtcdProcess) -> None:
    async def scenario(etcd: Etcd, agent: NodeAgent, shard: FakeShard,
                       leases: list[Lease]) -> None:
        await hint(etcd, lambda h: True)
        await steady(agent)
        assert agent.lease is not None
        old = agent.lease.id
        await agent.lease.revoke()  # etcd drops the node and its hint with the lease
        again = await hint_kv(etcd, lambda kv: kv.lease != old)
        assert agent.lease.id != old and again.lease == agent.lease.id
        await steady(agent)
        await etcd.delete(keys.leader_key(0))  # an operator, or a hint lost some other way
        await hint_kv(etcd, lambda kv: True)

    run(etcd_proc, scenario)


def test_a_learner_of_a_steady_group_is_promoted(etcd_proc: EtcdProcess) -> None:
    async def scenario(etcd: Etcd, agent: NodeAgent, shard: FakeShard,
                       leases: list[Lease]) -> None:
        await hint(etcd, lambda h: True)
        await steady(agent)
        shard.learners_ = frozenset({raft("b")})  # rejoined after losing its disk
        await agent.publish_hints_once()
        for _ in range(100):
            if shard.changes:
                break
            await asyncio.sleep(0.01)  # the promotion runs in a task of its own
        assert shard.changes == [(raft("b"), None)]

    run(etcd_proc, scenario)


def test_a_new_replica_set_changes_the_membership_then_the_hint_epoch(
        etcd_proc: EtcdProcess) -> None:
    async def scenario(etcd: Etcd, agent: NodeAgent, shard: FakeShard,
                       leases: list[Lease]) -> None:
        await hint(etcd, lambda h: True)
        await steady(agent)
        read = await etcd.get(keys.shard_key(0))
        assert read is not None
        moved = await change_replicas(etcd, keys.decode_shard(read.value), read.mod_revision,
                                      ("a", "b", "d"))
        got = await hint(etcd, lambda h: h.epoch == moved.epoch)
        assert got.node_id == "a"
        assert shard.changes == [(None, raft("c")), (raft("d"), None)]

    run(etcd_proc, scenario)


def test_a_node_says_it_is_busy_while_its_loop_is_near_full_and_calm_after(
        etcd_proc: EtcdProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent measures its event loop's CPU share between two looks (it runs on that
    loop) and writes the node's record, under its lease, only when busy changes. (Busy at a
    tenth of a core here: with the rest of the suite on two cores, a loop that never waits
    gets well under the 0.85 of one a node has to itself.)"""
    monkeypatch.setenv(ENV_BUSY_AT, "0.1")

    async def scenario(etcd: Etcd, agent: NodeAgent, shard: FakeShard,
                       leases: list[Lease]) -> None:
        async def record() -> tuple[NodeRecord, int]:
            kv = await etcd.get(keys.node_key("a"))
            assert kv is not None
            return keys.decode_node(kv.value), kv.lease

        assert (await record())[0].busy is False
        await agent._note_load()  # the first look only marks where the next one counts from
        ends = time.monotonic() + 0.3
        while time.monotonic() < ends:  # the loop's thread never waits meanwhile
            pass
        await agent._note_load()
        node, lease = await record()
        assert node.busy is True and lease == agent.lease.id  # type: ignore[union-attr]
        revision = (await etcd.get(keys.node_key("a"))).mod_revision  # type: ignore[union-attr]
        await agent._note_load()  # still near full (the look itself): nothing written
        await asyncio.sleep(0.3)  # the loop idle
        await agent._note_load()
        node, _ = await record()
        assert node.busy is False
        assert (await etcd.get(keys.node_key("a"))).mod_revision > revision  # type: ignore[union-attr]

    run(etcd_proc, scenario)


def test_busy_and_calm_are_apart_and_a_node_can_be_told_to_be_always_busy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert not busy_after(False, 0.69) and busy_after(False, 0.7)
    assert busy_after(True, 0.6) and busy_after(True, 0.45) and not busy_after(True, 0.44)
    assert busy_after(False, 0.0, at=0.0) and busy_after(True, 0.0, at=0.0)
    assert busy_at() == BUSY_AT
    monkeypatch.setenv(ENV_BUSY_AT, "0")
    assert busy_at() == 0.0
    monkeypatch.setenv(ENV_BUSY_AT, "-1")
    with pytest.raises(ValueError):
        busy_at()
