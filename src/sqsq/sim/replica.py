"""One replica in the simulator: the real consensus core and the real delivery core, hosted
the way a node hosts them: for every ``Ready``, persist, then send, then apply.

The host also plays the shard's leader (``sqsq.sim.leading``): it stamps client commands
into log entries, answers a client once its entry is applied at the index and term it was
proposed at, serves reads after a ReadIndex round, and proposes sweeps. As a node's host
does, a leader shares what applying each entry wrote, and a follower writes that
write set instead of running the entry's commands when it has it (``sqsq.shard.writesets``):
only for the entry of its index, term and checksum.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqsq.core import commands as c
from sqsq.core.machine import effective_now, sweep_needed
from sqsq.core.state import ShardState
from sqsq.raft import Entry as RaftEntry
from sqsq.raft import Message, MsgType, RaftConfig, RaftNode, Ready, Role, Safeguards
from sqsq.shard.writesets import check as entry_check
from sqsq.sim.disk import ReplicaUnrecoverable, SimDisk
from sqsq.sim.leading import Leading
from sqsq.sim.machine import CONFIG, MachineSnapshot, Prepared, SimMachine
from sqsq.sim.wire import NodePing, Reply, Request, SnapshotChunk, WriteSet

if TYPE_CHECKING:
    from sqsq.sim.world import World

TICK_MS = 10
SWEEP_EVERY_MS = 1000
PING_EVERY_MS = 100  # the node's own heartbeat, one per peer node for all its groups
LIVENESS_MS = 400  # a quiet follower wakes when the leader's node is silent this long
SNAPSHOT_CHUNK = 4  # items per chunk: a snapshot crosses the network in pieces
MAX_WRITE_SETS = 256  # what a follower keeps of the leader's write sets not applied yet


def _sweep_needed(txn: object, now_ms: int) -> bool:
    return sweep_needed(ShardState(txn, CONFIG), effective_now(txn, now_ms))  # type: ignore[arg-type]


class SimReplica(Leading):
    def __init__(self, world: World, node_id: str, disk: SimDisk, config: RaftConfig,
                 safeguards: Safeguards) -> None:
        self.world = world
        self.id = node_id
        self.disk = disk
        self.config = config
        self.safeguards = safeguards
        self.core: RaftNode | None = None
        self.machine = SimMachine()
        self.clock_offset_ms = 0
        self.drift = 0.0  # how much faster than real time this node's clock runs
        self.incarnation = 0
        self.unrecoverable = False
        self.prepared_used = 0  # entries applied from what this replica prepared as leader
        self.retired = False
        self.read_seq = 0

    @property
    def up(self) -> bool:
        return self.core is not None

    # ---- life --------------------------------------------------------------------------

    def start(self) -> None:
        try:
            hs, meta, entries, data = self.disk.load()
        except ReplicaUnrecoverable as e:
            self.unrecoverable = True
            self.world.checker.violation("replica-unrecoverable", f"{self.id}: {e}")
            return
        self.machine = SimMachine(data)
        self.core = RaftNode(self.id, hard_state=hs, snapshot=meta, entries=entries,
                             applied=self.machine.applied,
                             rng=random.Random(self.world.rng.getrandbits(64)),
                             config=self.config, safeguards=self.safeguards)
        self.incarnation += 1
        self.busy = False  # a Ready is with the disk
        self.term_vote_written: tuple[int, str | None] | None = (hs.term, hs.vote)
        self.role = Role.FOLLOWER
        self.term = hs.term
        self.proposals: dict[int, tuple[int, Request]] = {}  # index -> (term, request)
        self.reads: dict[bytes, Request] = {}
        self.ready_reads: list[tuple[int, Request]] = []
        self.chunks: dict[tuple[str, int, int], dict[int, SnapshotChunk]] = {}
        self.staged: dict[tuple[int, int], MachineSnapshot] = {}  # whole, not yet installed
        self.prepared: dict[int, Prepared] = {}  # the leader's entries applied ahead
        self.write_sets: dict[int, WriteSet] = {}  # the leader's, by index, not applied yet
        self.last_sweep_ms = self.wall_ms()
        self.heard: dict[str, int] = {}  # node -> when anything last came from it (ms)
        self.last_ping_ms = -PING_EVERY_MS
        self._schedule_tick(self.incarnation)

    def crash(self, torn: bool = False) -> None:
        if self.core is None:
            return
        self.disk.crash(torn)
        self.core = None
        self.world.checker.on_down(self.id)
        self.world.refusing(self.id)

    def refused_by(self, node: str) -> None:
        """``node`` refused a connection (its process is gone, or a listener restarts): a
        node's host forgets the leader that lives there (``RaftNode.forget_leader``)."""
        core = self.core
        if core is not None and core.lead == node and not core.is_leader():
            core.forget_leader()
            self.process()

    def wall_ms(self) -> int:
        return int(self.world.now_ms * (1 + self.drift)) + self.clock_offset_ms

    def _schedule_tick(self, incarnation: int) -> None:
        period = max(1, round(TICK_MS / (1 + self.drift)))
        self.world.after(period, self._tick, incarnation)

    def _tick(self, incarnation: int) -> None:
        if self.core is None or incarnation != self.incarnation:
            return
        now = self.world.now_ms
        if now - self.last_ping_ms >= PING_EVERY_MS:
            self.last_ping_ms = now
            for peer in self.world.node_ids:
                if peer != self.id:
                    self.world.send(self.id, peer, NodePing(self.id))
        core = self.core
        if core.lead is not None and self.world.chance("false-refusal"):
            self.refused_by(core.lead)  # a refusal from a live leader's node: must be harmless
        if core.quiesced and not core.is_leader() and (
                core.lead is None or now - self.heard.get(core.lead, -LIVENESS_MS) > LIVENESS_MS):
            core.wake(leader_silent=True)  # the leader's node went silent: elect again
        core.tick()
        if core.is_leader() and self.wall_ms() - self.last_sweep_ms >= SWEEP_EVERY_MS:
            self.last_sweep_ms = self.wall_ms()
            if self.machine.query(_sweep_needed, self.wall_ms()):
                self._propose(None, c.Sweep())
        self.process()
        self._schedule_tick(incarnation)

    # ---- inputs ------------------------------------------------------------------------

    def receive(self, packet: object) -> None:
        if self.core is None:
            return
        if isinstance(packet, NodePing):
            self.heard[packet.frm] = self.world.now_ms
            return
        if isinstance(packet, WriteSet):
            self.heard[packet.frm] = self.world.now_ms
            if packet.index > self.machine.applied and len(self.write_sets) < MAX_WRITE_SETS:
                self.write_sets[packet.index] = packet
            return
        if isinstance(packet, SnapshotChunk):
            self.heard[packet.message.frm] = self.world.now_ms
            self._on_chunk(packet)
        elif isinstance(packet, Message):
            self.heard[packet.frm] = self.world.now_ms
            self.core.step(packet)
        elif isinstance(packet, Request):
            self._on_request(packet)
        self.process()

    def _on_chunk(self, chunk: SnapshotChunk) -> None:
        m = chunk.message
        key = (m.frm, m.snapshot.index, m.snapshot.term)  # type: ignore[union-attr]
        parts = self.chunks.setdefault(key, {})
        parts[chunk.part] = chunk
        if len(parts) == chunk.parts:  # whole: only now does the core hear of it
            del self.chunks[key]
            self.staged[key[1:]] = chunk.data  # by (index, term): installed if the core asks
            assert self.core is not None
            self.core.step(m)

    # ---- the Ready loop ----------------------------------------------------------------

    def process(self) -> None:
        """Hand the next Ready to the disk. Writing it takes simulated time, during which
        the core goes on taking messages and ticks (as it does on a node, where the fsync
        runs in a worker thread); the next Ready waits for this one's ``advance``."""
        if self.core is None or self.busy or not self.core.has_ready():
            return
        rd = self.core.ready()
        self.busy = True
        early = self._send_early(rd)
        if early and self.proposals:
            self._prepare_ahead(rd.entries)  # before its own write, as the host does
        self.world.after(self.world.rng.randint(*self.world.scenario.disk_ms), self._done,
                         (self.incarnation, rd, early))

    def _send_early(self, rd: Ready) -> frozenset[int]:
        """As the node's host does (``RaftReplica._send_early``): a leader whose term and
        vote are durable sends its appends and heartbeats before its own write of the Ready
        is done. The ids of the messages sent."""
        hs = rd.hard_state
        if rd.role is not Role.LEADER or not rd.entries or (
                hs is not None and (hs.term, hs.vote) != self.term_vote_written):
            return frozenset()
        early = [m for m in rd.messages if m.type in (MsgType.APPEND, MsgType.HEARTBEAT)]
        for m in early:
            self._send(m)
        return frozenset(map(id, early))

    def _done(self, arg: tuple[int, Ready, frozenset[int]]) -> None:
        incarnation, rd, early = arg
        if self.core is None or incarnation != self.incarnation:
            return  # crashed meanwhile: whatever was not synced is gone
        self.busy = False
        if not self._handle(rd, early):
            return
        self.core.advance(rd)
        if rd.entries and self.proposals and self.core.is_leader():
            self._prepare_ahead(rd.entries)  # unless done before the write
        self._after(rd)
        self.process()

    def _prepare_ahead(self, entries: Sequence[RaftEntry]) -> None:
        """As the node's host does (``Applier._prepare_ahead``): a leader's own entry right
        after the applied one, its apply worked out while the followers (and, when it has
        sent its appends early, its own disk) write theirs."""
        for e in entries:
            if e.index == self.machine.applied + 1 and e.index in self.proposals \
                    and e.index not in self.prepared:
                try:
                    prepared = self.machine.prepare(e)
                except Exception:  # noqa: BLE001 - the apply at commit meets it again
                    return
                if prepared is not None:
                    self.prepared[e.index] = prepared
                return

    def _handle(self, rd: Ready, early: frozenset[int] = frozenset()) -> bool:
        world, disk = self.world, self.disk
        # The snapshot first: a hard state whose commit it covers must not be durable
        # without it.
        if rd.snapshot is not None and not self._install(rd):
            return False
        if rd.entries:
            disk.write_entries(rd.entries)
        hs = rd.hard_state
        if hs is not None and (hs.term, hs.vote) != (self.term_vote_written or (-1, None)):
            # As the storage does: term and vote durable, the commit only along with them.
            disk.write_hard_state(hs)
            self.term_vote_written = (hs.term, hs.vote)
        if world.crash_point(self, "before-sync"):
            return False
        disk.sync()
        for m in rd.messages:
            if id(m) not in early and not self._send(m):
                return False
        for e in rd.committed:
            if not self._apply(e):
                return False
        for rs in rd.read_states:
            req = self.reads.pop(rs.context, None)
            if req is not None:
                self.ready_reads.append((rs.index, req))
        return True

    def _write_set_of(self, e: object) -> dict[bytes, bytes | None] | None:
        ws = self.write_sets.pop(e.index, None)  # type: ignore[attr-defined]
        if ws is None or (ws.term, ws.check) != (
                e.term, entry_check(e.data)):  # type: ignore[attr-defined]
            return None
        return ws.writes

    def _install(self, rd: Ready) -> bool:
        meta = rd.snapshot
        assert meta is not None
        data = self.staged.pop((meta.index, meta.term), None)
        if data is None:  # asked for again (a mutant accepts a repeated old snapshot)
            self.world.checker.violation("replica-stopped",
                                         f"{self.id}: snapshot {meta.index} not staged")
            self.crash()
            self.unrecoverable = True
            return False
        if self.world.chance("install-fails"):
            if self.disk.guard.failed_install_stops:
                self.crash()
                return False
            return True  # mutant: the failure is swallowed and the install answered
        if not self.disk.install(meta, data, cut=self.world.chance("mid-install")):
            self.crash()
            return False
        self.machine = SimMachine(data)
        self.world.checker.on_install(self.id, data)
        return True

    def _apply(self, e: object) -> bool:
        assert self.core is not None
        leads = self.core.is_leader()
        shared = None if leads else self._write_set_of(e)
        prepared = self.prepared.pop(e.index, None) if leads else None  # type: ignore
        if prepared is not None and (prepared.data != e.data  # type: ignore[attr-defined]
                                     or self.machine.applied != prepared.index - 1):
            prepared = None  # not the entry committed there, or the store moved
        elif prepared is not None:
            self.prepared_used += 1
        try:
            applied = self.machine.apply(e, shared, prepared)  # type: ignore[arg-type]
        except Exception as exc:  # a replica that cannot apply stops; the checker counts it
            self.world.checker.violation("replica-stopped", f"{self.id}: {exc!r:.200}")
            self.crash()
            self.unrecoverable = True
            return False
        self.world.checker.on_apply(self.id, applied)
        for index in [i for i in self.write_sets if i <= applied.index]:
            del self.write_sets[index]
        for index in [i for i in self.prepared if i <= applied.index]:
            del self.prepared[index]
        if leads and applied.writes is not None:
            ws = WriteSet(self.id, applied.index, applied.term,
                          entry_check(e.data), applied.writes)  # type: ignore[attr-defined]
            for peer in self.world.node_ids:
                if peer != self.id:
                    self.world.send(self.id, peer, ws)
        pending = self.proposals.pop(applied.index, None)
        if pending is not None:
            term, req = pending
            if term == applied.term and applied.outcomes:
                self._reply(req, Reply(req.req_id, "ok", applied.index, applied.term,
                                       applied.outcomes[0]))
            else:
                self._reply(req, Reply(req.req_id, "unknown"))
        return True

    def _after(self, rd: Ready) -> None:
        core = self.core
        assert core is not None
        if core.role is Role.LEADER and (self.role is not Role.LEADER or self.term != core.term):
            self.world.checker.on_leader(self.id, core)
        if core.role is not Role.LEADER and self.role is Role.LEADER:
            for _, req in self.proposals.values():
                self._reply(req, Reply(req.req_id, "unknown"))
            self.proposals.clear()
            for req in self.reads.values():
                self._reply(req, Reply(req.req_id, "unknown"))
            self.reads.clear()
        self.role, self.term = core.role, core.term
        still = []
        for index, req in self.ready_reads:
            if self.machine.applied >= index:
                self._reply(req, Reply(req.req_id, "read", index=index,
                                       issued_ms=req.issued_ms))
            else:
                still.append((index, req))
        self.ready_reads = still
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        core = self.core
        assert core is not None
        scenario = self.world.scenario
        if self.machine.applied - core.log.snapshot.index < scenario.compact_every:
            return
        data = self.machine.snapshot()
        if core.log.term(data.applied) is None or data.applied > core.log.stable:
            return  # the log moved on meanwhile (a snapshot from the leader replaced it)
        meta = core.snapshot_meta(data.applied)
        cut = self.world.cut_compaction(self)
        if not self.disk.save_snapshot(meta, data, scenario.compact_keep, cut_after=cut):
            self.crash()
            return
        core.compact(meta, scenario.compact_keep)

    def _send(self, m: Message) -> bool:
        if m.type is MsgType.SNAPSHOT:
            # The newest durable snapshot goes, which may be newer than the one the core
            # named when it wrote the message (the host took another meanwhile).
            data, meta = self.disk.snap_data, self.disk.snap_meta
            if data is None or meta is None or data.applied != meta.index:
                # a core asking for a snapshot its host never saved: only a mutant gets here
                self.world.checker.violation(
                    "replica-stopped", f"{self.id}: no durable snapshot to send to {m.to}")
                self.crash()
                return False
            m = dataclasses.replace(m, snapshot=meta)
            items = data.items
            parts = max(1, (len(items) + SNAPSHOT_CHUNK - 1) // SNAPSHOT_CHUNK)
            for part in range(min(parts, 8)):
                self.world.send(self.id, m.to, SnapshotChunk(m, part, min(parts, 8), data))
            return True
        self.world.send(self.id, m.to, m)
        return True
