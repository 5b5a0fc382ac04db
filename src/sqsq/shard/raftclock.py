"""A replica's Raft clock, for ``RaftReplica`` (through ``ReadyLoop``): the ticks that time
elections, heartbeats and leases, and what a quiet group watches instead of ticking. A node
ticks every replica it hosts from one clock; a replica no node ticks (``sqsq server``'s)
runs its own (``_ticker``).
"""

from __future__ import annotations

import asyncio
import time

from sqsq.raft import RaftNode


def node_of(member: str, shard_id: int) -> tuple[str, tuple[str, int]]:
    """The node (its id and its transport's address) behind a group member's address."""
    host, _, port = member.rpartition(":")
    base = int(port) - shard_id
    return f"{host}:{base}", (host, base)


class RaftClock:
    """Mixed into ``RaftReplica`` (through ``ReadyLoop``), whose state it works on."""

    # Set while this replica's own clock waits for the Ready loop's next turn.
    _clock_stopped: asyncio.Event | None = None

    async def _ticker(self) -> None:
        """The replica's own Raft clock (a replica no node clock ticks: ``sqsq server``'s).
        A one-member group gone quiet has nothing to time, no one to heartbeat and no leader
        to watch, and its ticks do nothing: the clock stops until the Ready loop turns again
        (every proposal, read and change turns it), so an idle server does not wake 20 times
        a second for nothing."""
        while True:
            await asyncio.sleep(self.settings.tick_s)
            self.tick()
            if self._alone_and_quiet():
                self._clock_stopped = stopped = asyncio.Event()
                await stopped.wait()

    def _alone_and_quiet(self) -> bool:
        core = self.core
        return (core is not None and core.quiesced and core.is_leader()
                and not self._reads.out and core.log.conf().members() <= {self.id})

    def tick(self) -> None:
        """One tick of the Raft clock. A quiet group does nothing, unless this replica
        follows a leader whose node has gone silent: then it wakes and counts again."""
        core = self.core
        if core is None or self.fatal is not None or self._stopped:
            return
        if self._reads.out:
            self._serve_reads()  # reads the core dropped with its leadership are answered
        if core.quiesced:
            leading = core.is_leader()
            if not self._watched_silent(core, leading):
                return
            # leading: a member's node fell silent, check the quorum again; following: the
            # leader's node did, its lease counts as run out
            core.wake(leader_silent=not leading)
        core.tick()
        self._kick.set()

    def _watched_silent(self, core: RaftNode, leading: bool) -> bool:
        """Whether a node this quiet replica watches fell silent: its followers' nodes when
        it leads, its leader's when it follows (no leader known counts as silent). The nodes
        are worked out once per membership and leader, not on every tick: a node ticks
        every replica it hosts twenty times a second."""
        conf, lead = core.log.conf(), core.lead
        watch = self._watch
        if watch is None or watch[0] is not conf or watch[1] != lead or watch[2] != leading:
            members = sorted(core.voters() - {self.id}) if leading else [lead] if lead else []
            watch = self._watch = (conf, lead, leading,
                                   tuple(node_of(m, self.shard_id)[0] for m in members))
        if not (leading or lead):
            return True
        if self.heard is None:
            return bool(watch[3])
        now = time.monotonic()
        for node in watch[3]:
            heard = self.heard(node)
            if heard is None or now - heard > self.settings.liveness_s:
                return True
        return False
