"""What must hold whatever the faults, checked as the simulation runs and once it has settled.

Raft's own properties: election safety (one leader a term), log matching and state machine
safety (every replica applies the same entry at each index: a hash chain over the applied
entries must agree), leader completeness (a new leader holds every entry known committed).
What sqsq promises on top: an acknowledged send is never lost, a receipt handle superseded
by a later receive never deletes, FIFO groups are delivered in send order, and a read sees
every write acknowledged before it was asked for.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sqsq.core import commands as c
from sqsq.core import records as r
from sqsq.raft import RaftNode
from sqsq.sim.machine import Applied, MachineSnapshot, SimMachine


@dataclass
class Violation:
    kind: str
    detail: str


@dataclass
class Checker:
    violations: list[Violation] = field(default_factory=list)
    leaders: dict[int, str] = field(default_factory=dict)  # term -> leader
    chain: dict[int, tuple[int, bytes]] = field(default_factory=dict)  # index -> (term, chain)
    outcomes: dict[int, tuple[c.Outcome, ...] | None] = field(default_factory=dict)
    commands: dict[int, tuple] = field(default_factory=dict)  # index -> the entry's commands
    writes_chain: dict[int, bytes] = field(default_factory=dict)  # index -> what was written
    applied: dict[str, int] = field(default_factory=dict)  # node -> last applied index
    max_applied: int = 0
    acked_sends: dict[str, int] = field(default_factory=dict)  # message id -> acked index
    ack_times: list[tuple[int, int]] = field(default_factory=list)  # (ms, index) of acks
    acks: int = 0
    reads: int = 0
    written: int = 0  # entries a follower applied from the leader's write set

    def violation(self, kind: str, detail: str) -> None:
        if len(self.violations) < 50:
            self.violations.append(Violation(kind, detail))

    # ---- Raft ------------------------------------------------------------------------------

    def on_leader(self, node: str, core: RaftNode) -> None:
        term = core.term
        if self.leaders.setdefault(term, node) != node:
            self.violation("election-safety",
                           f"term {term}: {self.leaders[term]} and {node} both lead")
        log = core.log
        for index in range(log.snap.index + 1, self.max_applied + 1):
            known = self.chain.get(index)
            if known is not None and log.term(index) != known[0]:
                self.violation("leader-completeness",
                               f"{node} leads term {term} without committed entry {index} "
                               f"(holds term {log.term(index)}, committed term {known[0]})")
                return
        if log.snap.index > self.max_applied:
            return
        known = self.chain.get(log.snap.index)
        if log.snap.index and known is not None and known[0] != log.snap.term:
            self.violation("leader-completeness", f"{node}: snapshot term differs")

    def on_apply(self, node: str, a: Applied) -> None:
        last = self.applied.get(node)
        if last is not None and a.index != last + 1:
            self.violation("state-machine-safety",
                           f"{node} applied {a.index} after {last}")
        self.applied[node] = a.index
        known = self.chain.get(a.index)
        if known is None:
            self.chain[a.index] = (a.term, a.chain)
            self.max_applied = max(self.max_applied, a.index)
        elif known != (a.term, a.chain):
            self.violation("state-machine-safety",
                           f"{node} applied a different entry at {a.index} "
                           f"(term {a.term}, committed term {known[0]})")
            return
        if a.writes is not None and a.outcomes is None:
            self.written += 1
        if self.outcomes.get(a.index) is None:  # a write set's apply has no outcomes
            self.outcomes[a.index] = a.outcomes
            self.commands[a.index] = a.commands
        if self.writes_chain.setdefault(a.index, a.writes_chain) != a.writes_chain:
            self.violation("state-machine-safety",
                           f"{node} wrote something else than another replica at {a.index}")

    def on_install(self, node: str, data: MachineSnapshot) -> None:
        known = self.chain.get(data.applied)
        if known is not None and known[1] != data.chain:
            self.violation("state-machine-safety", f"{node} installed a foreign snapshot")
        self.applied[node] = data.applied

    def on_down(self, node: str) -> None:
        self.applied.pop(node, None)

    # ---- what clients were told ------------------------------------------------------------

    def on_ack(self, now_ms: int, index: int, term: int, outcome: c.Outcome) -> None:
        self.acks += 1
        known = self.chain.get(index)
        if known is None or known[0] != term:
            self.violation("acknowledged-not-committed",
                           f"an acknowledged write at {index} (term {term}) is not the entry "
                           f"applied there")
            return
        self.ack_times.append((now_ms, index))
        if isinstance(outcome.result, c.BatchResult):
            for sent in outcome.result.successful:
                if isinstance(sent, c.SentMessage):
                    self.acked_sends.setdefault(sent.message_id, index)

    def on_read(self, issued_ms: int, read_index: int) -> None:
        self.reads += 1
        before = max((i for t, i in self.ack_times if t < issued_ms), default=0)
        if read_index < before:
            self.violation("stale-read", f"a read asked at {issued_ms} ms was served at "
                           f"{read_index}, before the write acknowledged at {before}")

    # ---- once settled ----------------------------------------------------------------------

    def final(self, machines: dict[str, SimMachine]) -> None:
        ends = {n: (m.applied, m.chain) for n, m in machines.items()}
        if len(set(ends.values())) > 1:
            self.violation("divergence", f"replicas ended apart: {ends}")
        self._check_delivery(machines)

    def _check_delivery(self, machines: dict[str, SimMachine]) -> None:
        """Walk the committed log in order: superseded handles, FIFO order, lost sends."""
        latest: dict[str, str] = {}  # message id -> the handle of its latest receive
        handle_of: dict[str, str] = {}  # handle -> message id
        deleted: set[str] = set()
        group_of: dict[str, str] = {}
        order: dict[str, list[str]] = defaultdict(list)  # group -> message ids as sent
        for index in sorted(self.outcomes):
            outs = self.outcomes[index]
            cmds = self.commands.get(index)
            if not outs or cmds is None:
                continue
            for cmd, out in zip(cmds, outs, strict=True):
                res = out.result
                if isinstance(cmd, c.SendMessages) and isinstance(res, c.BatchResult):
                    entries = {e.entry_id: e for e in cmd.entries}
                    for sent in res.successful:
                        e = entries[sent.entry_id]
                        if e.message_group_id is not None and sent.message_id not in group_of:
                            group_of[sent.message_id] = e.message_group_id
                            order[e.message_group_id].append(sent.message_id)
                elif isinstance(res, c.Received):
                    self._on_received(index, res, latest, handle_of, deleted, group_of, order)
                elif isinstance(cmd, c.DeleteMessages) and isinstance(res, c.BatchResult):
                    handles = dict(cmd.entries)
                    for entry_id in res.successful:
                        h = handles[entry_id]
                        mid = handle_of.get(h)
                        if mid is None or mid in deleted:
                            continue
                        if latest.get(mid) != h:
                            self.violation("stale-handle-accepted",
                                           f"a superseded handle deleted {mid} at {index}")
                        deleted.add(mid)
        for name, m in machines.items():
            present = {r.MessageRecord.decode(v).message_id
                       for _, v in m.store.scan(b"m", b"n")}
            lost = [mid for mid in self.acked_sends if mid not in present and mid not in deleted]
            if lost:
                self.violation("acknowledged-send-lost",
                               f"{name} lacks {len(lost)} acknowledged message(s), e.g. "
                               f"{lost[0]} (acknowledged at {self.acked_sends[lost[0]]})")

    def _on_received(self, index: int, res: c.Received, latest: dict[str, str],
                     handle_of: dict[str, str], deleted: set[str], group_of: dict[str, str],
                     order: dict[str, list[str]]) -> None:
        seen: set[str] = set()
        for msg in res.messages:
            latest[msg.message_id] = msg.receipt_handle
            handle_of[msg.receipt_handle] = msg.message_id
            group = group_of.get(msg.message_id)
            if group is not None:
                for earlier in order[group]:
                    if earlier == msg.message_id:
                        break
                    if earlier not in deleted and earlier not in seen:
                        self.violation("fifo-order", f"group {group}: {msg.message_id} "
                                       f"delivered at {index} before {earlier}")
                        break
            seen.add(msg.message_id)
