"""A node's life in the cluster: registered in etcd, hosting the shards the map gives it,
publishing a leader hint for the shards it leads, and (one node at a time) the controller.

The agent never sits on the data path: the shard replicas serve whether etcd answers or not.
What etcd being away costs is only what needs it: a new shard replica cannot be opened, a hint
cannot be refreshed. When the node's lease is lost (etcd away for longer than its TTL) the
agent registers again under a new lease as soon as etcd is back, and republishes its hints.

Opening a replica is the caller's (``open_shard``): the agent decides which and how.
A replica whose data directory is new either founds its group (the shard's first replica set,
``bootstrap``) or rejoins it as a learner. The difference is recorded in etcd, not on the
disk that may have been lost: a founding member writes ``/sqsq/joined/<shard>/<node>``
(create-only) before it first opens the replica; a node that finds that key already there
has lost its disk, and must not vote as if it remembered what it voted for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from sqsq.control import keys
from sqsq.control.balance import busy_after, busy_at, next_move
from sqsq.control.controller import Controller, ControllerSettings
from sqsq.control.etcd import Etcd, EtcdError, create_revision_is, put_op
from sqsq.control.keys import LeaderHint, NodeRecord, ShardRecord
from sqsq.control.lease import Lease
from sqsq.control.partition_map import PartitionMap, publish_leader, register_node

log = logging.getLogger("sqsq.agent")

LEASE_TTL_S = 3  # a dead node's key is gone within this; its shards' hints with it
HINT_INTERVAL_S = 0.2  # how often leadership is looked at (a new leader is published within)
RETRY_S = 0.5
BALANCE_INTERVAL_S = 1.0  # how often the spread of leaders is looked at (``balance``)
BALANCE_SETTLE_S = 3.0  # after a hand-over: the new leader's hint is in the map by then
HAND_OVER_S = 2.0


class HostedShard(Protocol):
    """What the agent needs of a replica it opened."""

    def leading_term(self) -> int | None: ...  # the Raft term while this replica leads

    def members(self) -> frozenset[str]: ...  # Raft addresses, as its log has them

    def learners(self) -> frozenset[str]: ...  # those of them that do not vote yet

    async def change_member(self, add: str | None = None,
                            remove: str | None = None) -> bool: ...

    # leadership to the caught-up follower ``to`` (a Raft address); the new leader's Raft
    # address, or None if this replica still leads
    async def hand_over(self, pick: int = 0, timeout_s: float = ...,
                        to: str | None = None) -> str | None: ...


OpenShard = Callable[[int, list[NodeRecord], bool], Awaitable[HostedShard]]


class NodeAgent:
    def __init__(self, etcd: Etcd, me: NodeRecord, open_shard: OpenShard,
                 controller: ControllerSettings, *, lease_ttl_s: int = LEASE_TTL_S,
                 pace: Callable[[], Awaitable[None]] | None = None) -> None:
        """``pace``: waits between two passes over the leader hints (by default
        ``HINT_INTERVAL_S``; a node gives its Raft clock's heartbeat round, as often, so
        that the passes cost no wake-up of their own)."""
        self.etcd = etcd
        self.open_shard = open_shard
        self.controller = controller
        self.lease_ttl_s = lease_ttl_s
        self._pace = pace or (lambda: asyncio.sleep(HINT_INTERVAL_S))
        self.hosted: dict[int, HostedShard] = {}
        self.map: PartitionMap | None = None
        self.lease: Lease | None = None
        self._registered = asyncio.Event()
        self._published: dict[int, tuple[int, int, int]] = {}  # shard -> term, epoch, lease
        self._promoting: dict[int, asyncio.Task] = {}  # shard -> a learner's promotion
        # shard -> (replica, term, lease, map snapshot, members, learners) as the last pass
        # that found nothing to do for it saw them (``_steady``)
        self._seen_steady: dict[int, tuple] = {}
        self._tasks: list[asyncio.Task] = []
        self._busy_at = busy_at()
        self._busy = self._busy_at == 0  # as ``busy_after`` last found it
        self.me = replace(me, busy=self._busy)  # (``me.busy``: as published)
        self._load_seen: tuple[float, float] | None = None  # (monotonic, loop CPU) then

    async def start(self) -> None:
        """Register, load the map, and start following it. Raises ``EtcdError`` if etcd
        does not answer within its retry window (a node cannot join without it)."""
        await self.etcd.put(keys.member_key(self.me.node_id), keys.encode(self.me))
        await self._register()
        self.map = await PartitionMap.load(self.etcd)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._stay_registered()),
                       loop.create_task(self._host_shards()),
                       loop.create_task(self._publish_hints()),
                       loop.create_task(self._balance_leaders()),
                       loop.create_task(Controller(self.etcd, self.me, self.map,
                                                   self.controller,
                                                   lambda: self.lease).run())]

    async def close(self) -> None:
        tasks = [*self._tasks, *self._promoting.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.map is not None:
            await self.map.close()
        if self.lease is not None:
            with contextlib.suppress(EtcdError, asyncio.TimeoutError):
                await asyncio.wait_for(self.lease.revoke(), 2.0)

    # -- registration ----------------------------------------------------------------------

    async def _register(self) -> None:
        lease = await Lease.grant(self.etcd, self.lease_ttl_s)
        await register_node(self.etcd, self.me, lease)
        self.lease = lease
        self._published.clear()  # hints lived under the old lease
        self._seen_steady.clear()
        self._registered.set()
        log.info("node %s registered (lease %x)", self.me.node_id, lease.id)

    async def _stay_registered(self) -> None:
        while True:
            assert self.lease is not None
            await self.lease.lost.wait()
            self._registered.clear()
            while True:
                try:
                    await self._register()
                    break
                except EtcdError as exc:
                    log.warning("node %s: registering again failed: %s", self.me.node_id, exc)
                    await asyncio.sleep(RETRY_S)

    # -- shards ----------------------------------------------------------------------------

    async def _host_shards(self) -> None:
        assert self.map is not None
        while True:
            snapshot = self.map.snapshot
            for shard in sorted(snapshot.shards.values(), key=lambda s: s.shard_id):
                if self.me.node_id in shard.replicas and shard.shard_id not in self.hosted:
                    peers = [snapshot.members.get(n) for n in shard.replicas]
                    if None in peers:
                        continue  # a replica's node has not registered yet
                    try:
                        await self._open(shard, [p for p in peers if p is not None])
                    except EtcdError as exc:
                        log.warning("shard %d: cannot open yet: %s", shard.shard_id, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await self.map.wait_for(lambda s, r=snapshot.revision: s.revision > r,
                                        timeout_s=RETRY_S * 4)

    async def _open(self, shard: ShardRecord, peers: list[NodeRecord]) -> None:
        bootstrap = shard.epoch == 1 and await self._claim_founding(shard.shard_id)
        log.info("shard %d: opening a replica (epoch %d, peers %s%s)", shard.shard_id,
                 shard.epoch, ", ".join(p.node_id for p in peers),
                 ", founding" if bootstrap else "")
        self.hosted[shard.shard_id] = await self.open_shard(shard.shard_id, peers, bootstrap)

    async def _claim_founding(self, shard_id: int) -> bool:
        """True the first time this node opens ``shard_id`` (it founds the group); False if
        it did before (its data, if now missing, was lost: it rejoins as a learner)."""
        key = keys.joined_key(shard_id, self.me.node_id)
        result = await self.etcd.txn([create_revision_is(key, 0)], [put_op(key, b"")])
        return result.succeeded

    # -- leader hints ----------------------------------------------------------------------

    async def _publish_hints(self) -> None:
        """For each shard this replica leads: first bring the group's Raft membership to the
        replica set the map records (one change at a time), then publish the leader hint
        with the epoch the membership now matches."""
        while True:
            await self._registered.wait()
            await self.publish_hints_once()
            await self._pace()

    async def publish_hints_once(self) -> None:
        """One pass over the hosted shards (``_publish_hints`` makes one every
        ``HINT_INTERVAL_S``, or at each ``pace``). A shard this replica does not lead, or
        whose last pass found nothing to do and nothing it looked at changed since
        (``_steady``), costs a few attribute reads: no await, no etcd call. An idle node
        leads a third of its shards and passes over all of them five times a second."""
        for shard_id, hosted in list(self.hosted.items()):
            if self._steady(shard_id, hosted):
                continue
            try:
                await self._lead_shard(shard_id, hosted)
            except EtcdError as exc:
                log.warning("shard %d: leader hint not published: %s", shard_id, exc)

    def _steady(self, shard_id: int, hosted: HostedShard) -> bool:
        """Whether ``_lead_shard`` would do nothing for this shard: it does not lead, or the
        last pass found its membership as the map wants it, no learner to promote and its
        hint published and standing, and what that pass read is still what it was: the same
        replica leading in the same term, the same live lease, the same map snapshot (a new
        one for every etcd change, a replaced or deleted hint among them), the same members
        and learners."""
        term = hosted.leading_term()
        if term is None:
            return True
        seen = self._seen_steady.get(shard_id)
        lease = self.lease
        return (seen is not None and seen[0] is hosted and seen[1] == term
                and seen[2] is lease and lease is not None and lease.alive
                and self.map is not None and seen[3] is self.map.snapshot
                and seen[4] == hosted.members() and seen[5] == hosted.learners())

    async def _lead_shard(self, shard_id: int, hosted: HostedShard) -> None:
        term = hosted.leading_term()
        lease = self.lease
        if term is None or lease is None or not lease.alive or self.map is None:
            return
        snapshot = self.map.snapshot
        shard = snapshot.shards.get(shard_id)
        if shard is None or any(n not in snapshot.members for n in shard.replicas):
            return
        wanted = {snapshot.members[n].raft_for(shard_id) for n in shard.replicas}
        have = hosted.members()
        if have != wanted:
            if self.me.raft_for(shard_id) not in wanted:
                return  # this replica is being replaced: not its change to make
            # Remove first: the member leaving is the one that died, and a group of the two
            # live members commits the next change without it.
            remove = sorted(have - wanted)[:1]
            add = [] if remove else sorted(wanted - have)[:1]
            ok = await hosted.change_member(add=add[0] if add else None,
                                            remove=remove[0] if remove else None)
            log.info("shard %d: %s %s: %s", shard_id, "removing" if remove else "adding",
                     (remove or add)[0], "done" if ok else "failed, will retry")
            return
        learning = self._promote_learner(shard_id, hosted, wanted)
        if self._published.get(shard_id) == (term, shard.epoch, lease.id) and \
                self._hint_standing(shard_id, term, shard.epoch):
            if not learning:  # nothing to do here until something read above changes
                self._seen_steady[shard_id] = (hosted, term, lease, snapshot, have,
                                               hosted.learners())
            return
        if await publish_leader(self.etcd, LeaderHint(shard_id, self.me.node_id, term,
                                                      shard.epoch), lease):
            self._published[shard_id] = (term, shard.epoch, lease.id)
            log.info("shard %d: published as leader in term %d (epoch %d)", shard_id, term,
                     shard.epoch)

    def _promote_learner(self, shard_id: int, hosted: HostedShard,
                         wanted: set[str]) -> bool:
        """A wanted member still a learner gets its vote (in a task of its own: a slow
        catch-up must not hold up the hints of other shards). Its addition promotes it once
        caught up, but gives up after a while, and a leader elected meanwhile never knew of
        it: a replica replaced behind a slow link stayed a learner for good, the group two
        voters while the map said three (the chaos scenario replace-slow-catch-up). True
        while a wanted member is a learner."""
        learners = sorted(hosted.learners() & wanted)
        running = self._promoting.get(shard_id)
        if not learners or (running is not None and not running.done()):
            return bool(learners)

        async def promote() -> None:
            ok = await hosted.change_member(add=learners[0])
            log.info("shard %d: promoting learner %s: %s", shard_id, learners[0],
                     "done" if ok else "not yet, will retry")

        self._promoting[shard_id] = asyncio.get_running_loop().create_task(promote())
        return True

    async def _balance_leaders(self) -> None:
        """Hand a shard's leadership to a node leading two or more fewer (``balance``), and
        say in this node's record whether it is busy."""
        while True:
            await asyncio.sleep(BALANCE_INTERVAL_S)
            if self.map is None or not self._registered.is_set():
                continue
            await self._note_load()
            snapshot = self.map.snapshot
            move = next_move(snapshot, self.me.node_id)
            hosted = self.hosted.get(move.shard_id) if move else None
            target = snapshot.members.get(move.to_node) if move else None
            if move is None or hosted is None or target is None or \
                    hosted.leading_term() is None:
                continue
            wanted = target.raft_for(move.shard_id)
            if wanted not in hosted.members():
                continue  # its membership change is still under way
            new = await hosted.hand_over(timeout_s=HAND_OVER_S, to=wanted)
            log.info("shard %d: leadership handed to %s to spread the leaders (asked for %s)",
                     move.shard_id, new, move.to_node)
            await asyncio.sleep(BALANCE_SETTLE_S)

    async def _note_load(self) -> None:
        """This node's record says busy while its event loop is near full (``busy_after``,
        from the loop thread's CPU time since the last look; the agent runs on that thread).
        Written only when it changes, so an idle cluster writes nothing."""
        now, cpu = time.monotonic(), time.thread_time()
        last, self._load_seen = self._load_seen, (now, cpu)
        if last is None or now <= last[0]:
            return
        self._busy = busy_after(self._busy, (cpu - last[1]) / (now - last[0]), self._busy_at)
        if self._busy == self.me.busy or self.lease is None:
            return
        me = replace(self.me, busy=self._busy)
        try:
            await register_node(self.etcd, me, self.lease)
        except EtcdError as exc:
            log.warning("node %s: load not published: %s", me.node_id, exc)
            return
        self.me = me  # (registering again after a lost lease writes it as it is now)
        log.info("node %s: %s", me.node_id, "busy: standard queues' sends spread from the "
                 "shards it leads" if me.busy else "no longer busy")

    def _hint_standing(self, shard_id: int, term: int, epoch: int) -> bool:
        """Our hint is what the map holds (it was not replaced or deleted meanwhile)."""
        if self.map is None:
            return False
        hint = self.map.snapshot.leaders.get(shard_id)
        return hint == LeaderHint(shard_id, self.me.node_id, term, epoch)
