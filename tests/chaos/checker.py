"""The chaos suite's checker: pure functions over a history (see driver.py for its format).

Events must be in real-time order, as the driver writes them (an invoke line precedes its
request, a completion line follows its response); ``load_history`` merges several files by
``t``. "A before B" below always means: A's completion line precedes B's invoke line, so the
server handled A before B. Nothing is judged on an order the history does not prove, so
concurrency, at-least-once redelivery and unknown outcomes never make a false violation.

Messages are identified by (queue, body); every body the driver sends is unique. A logical
send is all attempts with that body (a FIFO send retried with its deduplication id): it is
acknowledged if any attempt is ``ok``, unknown if none is but one is ``info`` or never
completed, failed otherwise.

- lost: an acknowledged send never delivered by an ``ok`` receive (a message can only leave
  the queue through a delete with a handle some client saw, so without a drain, or with one
  that hit its bound, "not found" still counts: the run could not show it is there); and,
  once a drain note says the queues were emptied, a delivered MessageId no delete (``ok`` or
  ``info``) was ever attempted for (it vanished without being deleted).
- unexpected: a delivered body no send was ever invoked for.
- duplicated: a body delivered as several MessageIds (extra ids counted); redeliveries of the
  same MessageId are counted apart. Both reported, never failures.
- stale deletes accepted: a delete or visibility change answered ``ok`` for a handle that was
  superseded: a receive of the same MessageId, invoked after the handle's receive completed,
  completed with another handle before the op was invoked. A delete of a message that is
  already gone succeeds (as in SQS), so an accepted stale delete is excused when another
  delete of that message, with a handle no older than the stale one, was attempted
  (``ok``/``info``) before the stale one completed.
- resurrected (reported): a MessageId delivered by a receive invoked after a delete of it
  was accepted; sqsq's deletes are final (a stale handle is refused, not ignored), so this
  is an acknowledged delete undone. Not in ``is_ok`` (SQS standard queues allow it).
- FIFO violations: per group, a message B delivered before A where A's send was acknowledged
  before B's was invoked (every delivery of A after B's, or behind B in one response); and a
  deduplication id delivered as several MessageIds within the 5-minute window.
- unavailability: per phase, the longest interval with ops being attempted and none of them
  completing ``ok``. An empty long poll counts when it answers, so a healthy run with every
  client polling an empty queue shows about the driver's 1 s wait.
- client gaps (reported): the same, for each client on its own. While one shard is without
  a leader, clients served by the other keep the suite's measure low; a client whose calls
  went to the lost leader waited this long.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEDUP_WINDOW_S = 300.0
SEND_OPS = ("send", "send_batch")
DELETE_OPS = ("delete", "delete_batch")
FENCED_OPS = (*DELETE_OPS, "change_visibility", "change_visibility_batch")
MAX_DETAILS = 20


@dataclass
class Op:
    id: str
    process: str
    phase: str
    queue: str
    op: str
    req: dict[str, Any]
    invoked: int  # index of the invoke event
    t_invoke: float
    type: str = "info"  # no completion line: outcome unknown
    resp: dict[str, Any] = field(default_factory=dict)
    completed: int = 1 << 62  # index of the completion; "never" if missing
    t_complete: float | None = None


@dataclass
class Delivery:
    queue: str
    message_id: str
    body: str
    handle: str
    op: Op
    pos: int  # position in the receive's response


@dataclass
class Report:
    acknowledged: dict[str, int] = field(default_factory=dict)  # ok ops per kind
    sends_acknowledged: int = 0
    delivered_messages: int = 0  # distinct MessageIds
    lost: int = 0
    unknown_found: int = 0
    unknown_not_found: int = 0
    deduplicated_sends: int = 0  # acknowledged, dropped for another's deduplication id
    failed_found: int = 0  # a send answered fail, later delivered (reported, see is_ok)
    unexpected: int = 0
    duplicated: int = 0
    redeliveries: int = 0
    stale_deletes_accepted: int = 0
    stale_rejected: int = 0  # superseded handles correctly refused: fencing was exercised
    resurrected: int = 0  # deliveries after an accepted delete (reported, see is_ok)
    fifo_order_inversions: int = 0
    fifo_dedup_violations: int = 0
    max_unavailable_s: float = 0.0
    client_gaps_s: dict[str, float] = field(default_factory=dict)  # client -> its longest
    drain_complete: bool | None = None
    details: list[str] = field(default_factory=list)

    @property
    def ops_acknowledged(self) -> int:
        return sum(self.acknowledged.values())

    @property
    def fifo_violations(self) -> int:
        return self.fifo_order_inversions + self.fifo_dedup_violations

    def note(self, text: str) -> None:
        if len(self.details) < MAX_DETAILS:
            self.details.append(text)


def is_ok(report: Report) -> bool:
    return (report.lost == 0 and report.unexpected == 0 and
            report.stale_deletes_accepted == 0 and report.fifo_violations == 0)


def load_history(*paths: str | Path) -> list[dict[str, Any]]:
    """Events of one or more history files, merged by monotonic time (a torn last line from a
    killed driver is skipped)."""
    events: list[dict[str, Any]] = []
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    if len(paths) > 1:
        events.sort(key=lambda e: e.get("t", 0.0))  # stable: one file's order is kept
    return events


def parse_ops(events: list[dict[str, Any]]) -> tuple[list[Op], list[dict[str, Any]]]:
    ops: dict[str, Op] = {}
    notes = []
    for i, e in enumerate(events):
        kind = e.get("type")
        if kind == "invoke":
            ops[e["id"]] = Op(e["id"], e.get("process", "?"), e.get("phase", "load"),
                              e.get("queue", ""), e["op"], e.get("req") or {}, i,
                              e.get("t", float(i)))
        elif kind in ("ok", "fail", "info") and e.get("id") in ops:
            o = ops[e["id"]]
            o.type, o.resp, o.completed = kind, e.get("resp") or {}, i
            o.t_complete = e.get("t", float(i))
        elif kind == "note":
            notes.append(e)
    return list(ops.values()), notes


def entries(o: Op) -> list[tuple[dict[str, Any], str, dict[str, Any]]]:
    """(entry request, outcome, entry response) for each entry of a single or batch op."""
    if "entries" not in o.req:
        return [(o.req, o.type, o.resp)]
    if o.type != "ok":
        return [(e, o.type, {}) for e in o.req["entries"]]
    ok = {s["id"]: s for s in o.resp.get("successful", [])}
    failed = {f["id"]: f for f in o.resp.get("failed", [])}
    out = []
    for e in o.req["entries"]:
        if e["id"] in ok:
            out.append((e, "ok", ok[e["id"]]))
        elif e["id"] in failed:
            # the server's own fault (SenderFault false) leaves the entry's outcome unknown
            f = failed[e["id"]]
            out.append((e, "fail" if f.get("sender_fault") else "info", f))
        else:
            out.append((e, "info", {}))
    return out


@dataclass
class Send:
    queue: str
    body: str
    group: str | None = None
    dedup: str | None = None
    attempts: list[tuple[Op, str]] = field(default_factory=list)

    @property
    def status(self) -> str:
        kinds = {k for _, k in self.attempts}
        return "ok" if "ok" in kinds else "info" if "info" in kinds else "fail"

    @property
    def acked_at(self) -> int:
        return min(o.completed for o, k in self.attempts if k == "ok")

    @property
    def first_invoked(self) -> int:
        return min(o.invoked for o, _ in self.attempts)


class _History:
    """The indexes every check reads."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.ops, self.notes = parse_ops(events)
        self.sends: dict[tuple[str, str], Send] = {}
        self.deliveries: dict[tuple[str, str], list[Delivery]] = defaultdict(list)  # by mid
        self.by_body: dict[tuple[str, str], list[Delivery]] = defaultdict(list)
        self.by_handle: dict[str, Delivery] = {}
        self.responses: dict[str, list[Delivery]] = {}  # by receive op id
        for o in self.ops:
            if o.op in SEND_OPS:
                for e, kind, _ in entries(o):
                    s = self.sends.setdefault((o.queue, e["body"]),
                                              Send(o.queue, e["body"], e.get("group"),
                                                   e.get("dedup")))
                    s.attempts.append((o, kind))
            elif o.op == "receive" and o.type == "ok":
                resp = []
                for pos, m in enumerate(o.resp.get("messages", [])):
                    d = Delivery(o.queue, m["message_id"], m["body"], m["receipt_handle"], o,
                                 pos)
                    self.deliveries[(o.queue, d.message_id)].append(d)
                    self.by_body[(o.queue, d.body)].append(d)
                    self.by_handle[d.handle] = d
                    resp.append(d)
                self.responses[o.id] = resp

    def superseded(self, handle: str, at: int) -> bool:
        """Did a later receive of the handle's message complete, with another handle, before
        index ``at``?"""
        d = self.by_handle[handle]
        return any(other.handle != handle and other.op.invoked > d.op.completed and
                   other.op.completed < at
                   for other in self.deliveries[(d.queue, d.message_id)])


def check(events: list[dict[str, Any]]) -> Report:
    h = _History(events)
    r = Report()
    r.acknowledged = dict(Counter(o.op for o in h.ops if o.type == "ok"))
    drains = [n for n in h.notes if n.get("note") == "drain"]
    r.drain_complete = bool(drains[-1].get("complete")) if drains else None
    _check_sends(h, r)
    _check_deletes(h, r)
    _check_fifo(h, r)
    r.max_unavailable_s = longest_unavailability(h.ops)
    r.client_gaps_s = client_gaps(h.ops)
    return r


def _check_sends(h: _History, r: Report) -> None:
    for key, s in h.sends.items():
        found = key in h.by_body
        status = s.status
        if status == "ok":
            r.sends_acknowledged += 1
            if not found and _deduplicated(h, s):
                r.deduplicated_sends += 1
            elif not found:
                r.lost += 1
                r.note(f"lost: acknowledged send {s.body!r} to {s.queue} never delivered "
                       f"(acked by op {min(s.attempts, key=lambda a: a[0].completed)[0].id})")
        elif status == "info":
            if found:
                r.unknown_found += 1
            else:
                r.unknown_not_found += 1
        elif found:
            r.failed_found += 1
            r.note(f"note: send {s.body!r} answered fail but delivered")
    for (queue, body), ds in h.by_body.items():
        if (queue, body) not in h.sends:
            r.unexpected += 1
            r.note(f"unexpected: {body!r} delivered from {queue} (op {ds[0].op.id}) "
                   f"but never sent")
        mids = {d.message_id for d in ds}
        r.duplicated += len(mids) - 1
    r.delivered_messages = len(h.deliveries)
    r.redeliveries = sum(len(ds) - 1 for ds in h.deliveries.values())


def _deduplicated(h: _History, s: Send) -> bool:
    """Another body sent to the FIFO queue with the same deduplication id was delivered:
    SQS acknowledges the later send and drops it."""
    return s.dedup is not None and any(
        o.dedup == s.dedup and o.body != s.body and (o.queue, o.body) in h.by_body
        for o in h.sends.values() if o.queue == s.queue)


def _check_deletes(h: _History, r: Report) -> None:
    # every delete entry whose handle a receive returned, per message
    attempts: dict[tuple[str, str], list[tuple[Op, str, str]]] = defaultdict(list)
    fenced = []
    for o in h.ops:
        if o.op not in FENCED_OPS:
            continue
        for e, kind, _ in entries(o):
            handle = e.get("receipt_handle")
            if handle not in h.by_handle:
                continue
            d = h.by_handle[handle]
            if o.op in DELETE_OPS:
                attempts[(d.queue, d.message_id)].append((o, kind, handle))
            fenced.append((o, kind, handle, d))
    for o, kind, handle, d in fenced:
        if not h.superseded(handle, o.invoked):
            continue
        if kind == "fail":
            r.stale_rejected += 1
        if kind != "ok":
            continue
        if o.op in DELETE_OPS and any(
                k != "fail" and oh != handle and other.invoked < o.completed
                and not h.by_handle[oh].op.completed < d.op.invoked
                for other, k, oh in attempts[(d.queue, d.message_id)]):
            continue  # the message may already have been deleted: deleting again succeeds
        r.stale_deletes_accepted += 1
        r.note(f"stale {o.op} accepted: op {o.id} used handle {handle[:24]}... of "
               f"{d.message_id} from receive {d.op.id}, superseded before it was invoked")
    for (queue, mid), tries in attempts.items():
        gone = min((o.completed for o, k, _ in tries if k == "ok"), default=None)
        if gone is None:
            continue
        for d in h.deliveries[(queue, mid)]:
            if d.op.invoked > gone:
                r.resurrected += 1
                r.note(f"resurrected: {mid} delivered by {d.op.id} after a delete of it was "
                       f"accepted")
    if r.drain_complete:
        for (queue, mid), ds in h.deliveries.items():
            if not any(k != "fail" for _, k, _ in attempts[(queue, mid)]):
                r.lost += 1
                r.note(f"lost: {mid} ({ds[0].body!r}) delivered by {ds[0].op.id}, never "
                       f"deleted, gone after the drain")


def _check_fifo(h: _History, r: Report) -> None:
    groups: dict[tuple[str, str], list[Send]] = defaultdict(list)
    for s in h.sends.values():
        if s.queue.endswith(".fifo") and s.group is not None and (s.queue, s.body) in h.by_body:
            groups[(s.queue, s.group)].append(s)
    for (queue, group), sends in groups.items():
        acked = sorted((s for s in sends if s.status == "ok"), key=lambda s: s.acked_at)
        ack_idx = [a.acked_at for a in acked]
        # prefix_max[i]: among acked[:i+1], the one whose earliest possible delivery (the
        # invoke of its first receive) is latest
        prefix_max: list[tuple[int, Send]] = []
        for a in acked:
            first = min(d.op.invoked for d in h.by_body[(queue, a.body)])
            prefix_max.append(max(prefix_max[-1], (first, a), key=lambda x: x[0])
                              if prefix_max else (first, a))
        for b in sends:
            n_before = bisect.bisect_left(ack_idx, b.first_invoked)  # acked before b sent
            if not n_before:
                continue
            b_done = min(d.op.completed for d in h.by_body[(queue, b.body)])
            first_a, culprit = prefix_max[n_before - 1]
            if first_a <= b_done:
                culprit = _same_response_inversion(h, queue, b)
            if culprit is not None:
                r.fifo_order_inversions += 1
                r.note(f"FIFO order: in {queue} group {group}, {b.body!r} was delivered "
                       f"before {culprit.body!r}, whose send was acknowledged before "
                       f"{b.body!r} was sent")
    _check_dedup(h, r)


def _same_response_inversion(h: _History, queue: str, b: Send) -> Send | None:
    """An A acknowledged before B was sent, listed behind B in one response, with no
    delivery of A that may have come earlier."""
    for db in h.by_body[(queue, b.body)]:
        for da in h.responses[db.op.id][db.pos + 1:]:
            a = h.sends.get((queue, da.body))
            if a is None or a.group != b.group or a.status != "ok" or \
                    a.acked_at >= b.first_invoked:
                continue
            if all(d.op is db.op or d.op.invoked > db.op.completed
                   for d in h.by_body[(queue, a.body)]):
                return a
    return None


def _check_dedup(h: _History, r: Report) -> None:
    by_dedup: dict[tuple[str, str], list[Send]] = defaultdict(list)
    for s in h.sends.values():
        if s.queue.endswith(".fifo") and s.dedup is not None:
            by_dedup[(s.queue, s.dedup)].append(s)
    for (queue, dedup), sends in by_dedup.items():
        mids = {d.message_id for s in sends for d in h.by_body.get((queue, s.body), [])}
        if len(mids) < 2:
            continue
        ops = [o for s in sends for o, _ in s.attempts]
        if any(o.t_complete is None for o in ops) or \
                max(o.t_complete for o in ops) - min(o.t_invoke for o in ops) >= DEDUP_WINDOW_S:
            continue  # the copies may have been accepted more than 5 minutes apart
        r.fifo_dedup_violations += len(mids) - 1
        r.note(f"FIFO dedup: id {dedup!r} in {queue} delivered as {len(mids)} messages "
               f"{sorted(mids)}")


def longest_unavailability(ops: Iterable[Op]) -> float:
    """Per phase, the longest stretch without an ok completion while ops were attempted: from
    an ok completion with ops still pending (else from the next invoke) to the next ok
    completion, or to the last event if none came."""
    longest = 0.0
    phases: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for o in ops:
        phases[o.phase].append((o.t_invoke, 0, "invoke"))
        if o.t_complete is not None:
            phases[o.phase].append((o.t_complete, 1, o.type))
    for points in phases.values():
        start: float | None = None
        pending = 0
        for t, _, kind in sorted(points):
            if kind == "invoke":
                pending += 1
                if start is None:
                    start = t
                continue
            pending -= 1
            if kind == "ok":
                if start is not None:
                    longest = max(longest, t - start)
                start = t if pending else None
        if start is not None:
            longest = max(longest, max(t for t, _, _ in points) - start)
    return longest


def client_gaps(ops: Iterable[Op]) -> dict[str, float]:
    """Each load client's ``longest_unavailability`` over its own ops (the driver's queue
    setup and the drain left out): the longest it went without an ok answer while it had
    calls out."""
    by_client: dict[str, list[Op]] = defaultdict(list)
    for o in ops:
        if o.process not in ("setup", "drain"):
            by_client[o.process].append(o)
    return {c: longest_unavailability(mine) for c, mine in sorted(by_client.items())}


COLUMNS = ("scenario", "faults", "acked ops", "lost", "unexpected", "duplicated",
           "stale deletes", "FIFO viol.", "unknown found/not", "resurrected", "max unavail s",
           "result")


def format_table(rows: Iterable[tuple[str, int, Report]]) -> str:
    """One row per scenario with the counts the issue asks for."""
    lines = [[c for c in COLUMNS]]
    for name, faults, r in rows:
        lines.append([name, str(faults), str(r.ops_acknowledged), str(r.lost),
                      str(r.unexpected), f"{r.duplicated} (+{r.redeliveries} redeliv.)",
                      str(r.stale_deletes_accepted), str(r.fifo_violations),
                      f"{r.unknown_found}/{r.unknown_not_found}", str(r.resurrected),
                      f"{r.max_unavailable_s:.2f}", "ok" if is_ok(r) else "FAIL"])
    widths = [max(len(row[i]) for row in lines) for i in range(len(COLUMNS))]
    out = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
           for row in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)
