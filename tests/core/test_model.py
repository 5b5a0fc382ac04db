"""Model-based test of the pure core: random operations against a small reference model.

The model is deliberately plain: a dict of (queue, message id) -> what the message should be
doing, per-queue deduplication windows, and the list of every receipt handle ever issued.
After every step the queue's Approximate* counters must equal the model's counts, and every
operation's outcome must be the one the model predicts:

1. a send with a live deduplication id / request id returns the first message id, adds none;
2. receive returns only messages the model says are visible, each claimed by one new handle;
3. delete / change visibility succeed only with the latest handle; a stale one fails with
   InvalidParameterValue and changes nothing; on FIFO queues a handle whose timeout ran out
   no longer deletes; on standard queues it still changes visibility;
4. a message re-appears only after its deadline;
6. FIFO: a group's messages are delivered in send order, from its head, never past a message
   in flight (blocking is per message, as in Amazon: an older message visible again is
   received again while later ones are in flight);

and conservation: every accepted message is exactly one of delayed, visible, in flight,
deleted, dead-lettered, expired or purged.

The model mirrors sqsq's documented delivery order: standard queues hand out the messages
that have been visible longest first (ties in send order; a message back from in flight
counts as visible since it was sent, its original place); FIFO queues serve ready groups in
the order they became receivable (see ``_predict_receive``). Messages past their retention
period stay counted until a sweep or a receive that reaches them removes them (the counters
are approximate), and the model tracks exactly that.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from coresupport import Core
from sqsq.core import commands as c
from sqsq.errors import ErrorCode, Rejection

STD, STD_DLQ, FIFO, FIFO_DLQ = "s", "s-dlq", "f.fifo", "f-dlq.fifo"
ALL_QUEUES = (STD, STD_DLQ, FIFO, FIFO_DLQ)
BODIES = ("a", "b", "c")
BAD_BODY = "bad\x00body"
WINDOW_MS = 5 * 60 * 1000

PRESENT, DELETED, DEAD, EXPIRED, PURGED = "present", "deleted", "dead", "expired", "purged"
DELAYED, VISIBLE, IN_FLIGHT = "delayed", "visible", "in flight"


def arn(name: str) -> str:
    return f"arn:aws:sqs:us-east-1:000000000000:{name}"


@dataclass
class QModel:
    name: str
    fifo: bool
    vis_s: int
    delay_s: int
    retention_s: int
    dlq: str | None = None
    max_rc: int = 0
    cbd: bool = False
    scope: str = "queue"
    raw_attrs: dict[str, str] = field(default_factory=dict)
    dedup: dict[tuple[str, str], tuple[str, str | None, int]] = field(default_factory=dict)
    last_purge: int | None = None


@dataclass
class M:
    queue: str
    mid: str
    order: int  # enqueue order, shard-wide, as the core assigns sequence numbers
    body: str
    group: str | None
    sent_ms: int
    seqno: str | None
    dl_source: str | None = None
    status: str = PRESENT
    kind: str = VISIBLE  # for PRESENT: DELAYED / VISIBLE / IN_FLIGHT as last set
    at: int = 0  # DELAYED: due; IN_FLIGHT: deadline; VISIBLE: visible since
    rc: int = 0
    kept_from: int | None = None  # retention counts from here when not from sent_ms
    head_since: int = 0  # FIFO: when it became its group's head (its predecessor left)

    def expired(self, q: QModel, now: int) -> bool:
        start = self.sent_ms if self.kept_from is None else self.kept_from
        return start + q.retention_s * 1000 <= now


@dataclass(frozen=True)
class Handle:
    queue: str
    mid: str
    epoch: int
    text: str


def rejection(res: object) -> Rejection:
    assert isinstance(res, Rejection), res
    return res


class CoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.k = Core()
        self.queues: dict[str, QModel] = {}
        self.msgs: dict[tuple[str, str], M] = {}
        self.handles: list[Handle] = []
        self.order = 0
        self.accepted: set[tuple[str, str]] = set()

    # ---- model helpers ----------------------------------------------------------------

    @property
    def now(self) -> int:
        return self.k.now_ms

    def settle(self) -> None:
        """Timers that are due have fired: delayed and timed-out messages are visible."""
        for m in self.msgs.values():
            if m.status == PRESENT and m.kind != VISIBLE and m.at <= self.now:
                self.make_visible(m, m.at)

    def make_visible(self, m: M, at: int) -> None:
        """Visible since ``at``; a standard message back from in flight takes its original
        place (its send time)."""
        if m.kind == IN_FLIGHT and not self.queues[m.queue].fifo:
            at = m.sent_ms
        m.kind, m.at = VISIBLE, at

    def present(self, queue: str) -> list[M]:
        return sorted((m for m in self.msgs.values() if m.queue == queue and m.status == PRESENT),
                      key=lambda m: m.order)

    def leave(self, m: M, status: str) -> None:
        """``m`` is no longer present; in a FIFO queue, if it headed its group, the next
        message heads it from now on."""
        group = [x for x in self.present(m.queue) if x.group == m.group]
        m.status = status
        if self.queues[m.queue].fifo and len(group) > 1 and group[0] is m:
            group[1].head_since = self.now

    def next_order(self) -> int:
        self.order += 1
        return self.order

    def create(self, q: QModel) -> None:
        res = self.k.run(c.CreateQueue(q.name, tuple(q.raw_attrs.items())))
        assert res == c.QueueCreated(q.name), res
        self.queues[q.name] = q

    # ---- setup --------------------------------------------------------------------------

    @initialize(
        std_redrive=st.booleans(),
        fifo_redrive=st.booleans(),
        max_rc=st.integers(1, 3),
        retention=st.sampled_from([60, 400, 345_600]),
        vis=st.sampled_from([0, 5, 30]),
        delay=st.sampled_from([0, 0, 10]),
        cbd=st.booleans(),
        scope=st.sampled_from(["queue", "messageGroup"]),
    )
    def setup(self, std_redrive: bool, fifo_redrive: bool, max_rc: int, retention: int,
              vis: int, delay: int, cbd: bool, scope: str) -> None:
        base = {"VisibilityTimeout": str(vis), "MessageRetentionPeriod": str(retention)}
        fifo_base = {**base, "FifoQueue": "true"}
        if std_redrive:
            self.create(QModel(STD_DLQ, False, vis, 0, retention, raw_attrs=dict(base)))
        if fifo_redrive:
            self.create(QModel(FIFO_DLQ, True, vis, 0, retention, cbd=True,
                               raw_attrs={**fifo_base, "ContentBasedDeduplication": "true"}))
        std = QModel(STD, False, vis, delay, retention,
                     raw_attrs={**base, "DelaySeconds": str(delay)})
        fifo = QModel(FIFO, True, vis, delay, retention, cbd=cbd, scope=scope,
                      raw_attrs={**fifo_base, "DelaySeconds": str(delay),
                                 "ContentBasedDeduplication": str(cbd).lower(),
                                 "DeduplicationScope": scope})
        for q, on, dlq in ((std, std_redrive, STD_DLQ), (fifo, fifo_redrive, FIFO_DLQ)):
            if on:
                q.dlq, q.max_rc = dlq, max_rc
                q.raw_attrs["RedrivePolicy"] = (
                    f'{{"deadLetterTargetArn":"{arn(dlq)}","maxReceiveCount":{max_rc}}}')
            self.create(q)

    # ---- sends ---------------------------------------------------------------------------

    def _send(self, qname: str, entries: list[c.SendEntry], request_id: str) -> None:
        self.settle()
        q = self.queues[qname]
        res = self.k.run(c.SendMessages(qname, tuple(entries), request_id))
        assert isinstance(res, c.BatchResult), res
        ok = {s.entry_id: s for s in res.successful}
        failed = {f.entry_id: f.rejection for f in res.failed}
        assert len(ok) + len(failed) == len(entries)
        for e in entries:
            want = self._entry_error(q, e)
            if want is not None:
                assert e.entry_id in failed, (e, res)
                assert failed[e.entry_id].code is want, (e, failed[e.entry_id])
                continue
            assert e.entry_id in ok, (e, res)
            got = ok[e.entry_id]
            key = self._dedup_key(q, e, request_id)
            first = q.dedup.get(key) if key is not None else None
            if first is not None and first[2] > self.now:
                # Invariant 1: a duplicate maps to the first message; nothing new is stored.
                assert (got.message_id, got.sequence_number) == first[:2], (got, first)
                event(f"duplicate send to {qname}")
                continue
            assert (qname, got.message_id) not in self.msgs, "a message id was reused"
            assert (got.sequence_number is not None) == q.fifo
            # FIFO: only the queue's delay (an explicit 0 is accepted and changes nothing).
            delay = q.delay_s if q.fifo or e.delay_seconds is None else e.delay_seconds
            m = M(qname, got.message_id, self.next_order(), e.body, e.message_group_id,
                  self.now, got.sequence_number)
            if delay:
                m.kind, m.at = DELAYED, self.now + delay * 1000
            else:
                m.kind, m.at = VISIBLE, self.now
            self.msgs[(qname, m.mid)] = m
            self.accepted.add((qname, m.mid))
            if key is not None:
                q.dedup[key] = (m.mid, m.seqno, self.now + WINDOW_MS)

    @staticmethod
    def _entry_error(q: QModel, e: c.SendEntry) -> ErrorCode | None:
        if e.body == BAD_BODY:
            return ErrorCode.INVALID_MESSAGE_CONTENTS
        if not q.fifo:
            return None
        if e.delay_seconds:
            return ErrorCode.INVALID_PARAMETER_VALUE
        if e.message_group_id is None:
            return ErrorCode.MISSING_PARAMETER
        if e.message_deduplication_id is None and not q.cbd:
            return ErrorCode.INVALID_PARAMETER_VALUE
        return None

    @staticmethod
    def _dedup_key(q: QModel, e: c.SendEntry, request_id: str) -> tuple[str, str] | None:
        if not q.fifo:
            return ("request", f"{request_id}/{e.entry_id}") if request_id else None
        dedup = e.message_deduplication_id or hashlib.sha256(e.body.encode()).hexdigest()
        scope = (e.message_group_id or "") if q.scope == "messageGroup" else ""
        return scope, dedup

    @rule(
        bodies=st.lists(st.tuples(st.sampled_from(BODIES + (BAD_BODY,)),
                                  st.sampled_from([None, None, 0, 5, 100])),
                        min_size=1, max_size=3),
        request_id=st.sampled_from(["", "", "r1", "r2"]),
    )
    def send_standard(self, bodies: list[tuple[str, int | None]], request_id: str) -> None:
        entries = [c.SendEntry(f"e{i}", b, delay_seconds=d) for i, (b, d) in enumerate(bodies)]
        self._send(STD, entries, request_id)

    @rule(
        bodies=st.lists(st.tuples(
            st.sampled_from(BODIES + BODIES + (BAD_BODY,)),
            st.sampled_from(["A", "A", "B", "C", None]),
            st.sampled_from([None, None, "d1", "d2"]),
            st.sampled_from([None] * 8 + [0, 5]),
        ), min_size=1, max_size=3),
    )
    def send_fifo(self, bodies: list[tuple[str, str | None, str | None, int | None]]) -> None:
        entries = [
            c.SendEntry(f"e{i}", b, delay_seconds=d, message_group_id=g,
                        message_deduplication_id=dd)
            for i, (b, g, dd, d) in enumerate(bodies)
        ]
        self._send(FIFO, entries, "")

    # ---- receive ----------------------------------------------------------------------------

    def _predict_receive(self, q: QModel, n: int, timeout: int) -> list[M]:
        now = self.now
        dlq = self.queues.get(q.dlq) if q.dlq else None
        out: list[M] = []

        def offer(m: M) -> None:
            if m.expired(q, now):
                event("receive drops an expired message")
                self.leave(m, EXPIRED)
            elif dlq is not None and m.rc >= q.max_rc:
                event(f"dead-lettered from {q.name}")
                self.leave(m, DEAD)
                moved = M(dlq.name, m.mid, self.next_order(), m.body,
                          m.group if dlq.fifo else None, m.sent_ms, None, arn(q.name),
                          kind=VISIBLE, at=now, rc=m.rc,
                          # SQS restarts retention in a FIFO dead-letter queue only.
                          kept_from=now if dlq.fifo else m.kept_from)
                assert (dlq.name, m.mid) not in self.msgs
                self.msgs[(dlq.name, m.mid)] = moved
                self.accepted.add((dlq.name, m.mid))
            else:
                m.rc += 1
                m.kind, m.at = IN_FLIGHT, now + timeout * 1000
                out.append(m)

        present = self.present(q.name)
        if not q.fifo:
            for m in sorted((m for m in present if m.kind == VISIBLE),
                            key=lambda m: (m.at, m.order)):
                if len(out) >= n:
                    break
                offer(m)
            return out
        groups: dict[str | None, list[M]] = {}
        for m in present:
            groups.setdefault(m.group, []).append(m)
        # Per-message blocking: a group is receivable while its head is visible, and groups are
        # served in the order they became receivable (ties: by head message).
        ready = sorted((max(ms[0].at, ms[0].head_since), ms[0].order, g)
                       for g, ms in groups.items() if ms[0].kind == VISIBLE)
        for _, _, g in ready:
            for m in groups[g]:
                if len(out) >= n or m.kind != VISIBLE:
                    break
                offer(m)
        return out

    @rule(queue=st.sampled_from(ALL_QUEUES), n=st.integers(1, 10),
          timeout=st.one_of(st.none(), st.integers(0, 60)))
    def receive(self, queue: str, n: int, timeout: int | None) -> None:
        self.settle()
        res = self.k.run(c.ReceiveMessages(queue, n, timeout))
        if queue not in self.queues:
            assert rejection(res).code is ErrorCode.QUEUE_DOES_NOT_EXIST
            return
        assert isinstance(res, c.Received), res
        q = self.queues[queue]
        before = {m.mid: (m.kind, m.rc, m.at) for m in self.present(queue)}
        got = list(res.messages)
        # Invariants 2 and 4, stated on their own: only messages visible now come back, and
        # none of them is held by a live handle.
        for r in got:
            assert r.message_id in before, f"{r.message_id} is not in {queue}"
            kind, _, at = before[r.message_id]
            assert kind == VISIBLE, f"{r.message_id} returned while {kind} until {at}"
        assert len({r.message_id for r in got}) == len(got), "one message returned twice"
        # Invariant 6: FIFO groups are delivered in order, never past a message in flight.
        if q.fifo:
            for i, r in enumerate(got):
                m = self.msgs[(queue, r.message_id)]
                earlier = [x.mid for x in self.present(queue)
                           if x.group == m.group and x.order < m.order]
                returned_before = {x.message_id for x in got[:i]}
                for mid in earlier:
                    x = self.msgs[(queue, mid)]
                    gone = (x.expired(q, self.now)  # expired
                            or (q.dlq is not None and x.rc >= q.max_rc))  # dead-lettered
                    assert mid in returned_before or gone, (
                        f"{r.message_id} overtook {mid} in group {m.group}")
        predicted = self._predict_receive(q, n, q.vis_s if timeout is None else timeout)
        assert [r.message_id for r in got] == [m.mid for m in predicted], (got, predicted)
        event(f"receive from {queue}: {min(len(got), 2)}+ messages")
        for r, m in zip(got, predicted, strict=True):
            attrs = dict(r.attributes)
            assert r.body == m.body
            assert attrs["ApproximateReceiveCount"] == str(m.rc)
            assert attrs["SentTimestamp"] == str(m.sent_ms)
            assert attrs.get("DeadLetterQueueSourceArn") == m.dl_source
            if q.fifo:
                assert attrs["MessageGroupId"] == m.group
                if m.seqno is not None:
                    assert attrs["SequenceNumber"] == m.seqno
                else:
                    assert len(attrs["SequenceNumber"]) == 20
            self.handles.append(Handle(queue, m.mid, m.rc, r.receipt_handle))

    @rule(queue=st.sampled_from((STD, FIFO)), n=st.integers(1, 10),
          timeout=st.one_of(st.none(), st.integers(0, 60)))
    def receive_from_source(self, queue: str, n: int, timeout: int | None) -> None:
        self.receive(queue, n, timeout)

    @rule(queue=st.sampled_from((STD, FIFO)), times=st.integers(1, 4))
    def receive_with_zero_timeout(self, queue: str, times: int) -> None:
        # Messages come straight back: receive counts climb towards the redrive limit.
        for _ in range(times):
            self.receive(queue, 10, 0)

    # ---- delete and change visibility ----------------------------------------------------

    def _pick(self, i: int, recent: bool) -> Handle:
        if recent:
            return self.handles[-1 - i % min(len(self.handles), 6)]
        return self.handles[i % len(self.handles)]

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 1000), recent=st.booleans())
    def delete(self, i: int, recent: bool) -> None:
        self.settle()
        h = self._pick(i, recent)
        res = self.k.delete(h.queue, h.text)
        assert isinstance(res, c.BatchResult), res
        m = self.msgs[(h.queue, h.mid)]
        if m.status == PRESENT and m.rc != h.epoch:
            # Invariant 3: a superseded handle fails and changes nothing.
            (f,) = res.failed
            assert f.rejection.code is ErrorCode.INVALID_PARAMETER_VALUE, f
            assert "expired" in f.rejection.message
            event("delete with a stale handle")
            return
        if m.status == PRESENT and self.queues[h.queue].fifo and m.kind != IN_FLIGHT:
            # FIFO: a handle whose visibility timeout ran out has expired; the message stays.
            (f,) = res.failed
            assert f.rejection.code is ErrorCode.INVALID_PARAMETER_VALUE, f
            assert "expired" in f.rejection.message
            event("delete with a timed-out FIFO handle")
            return
        assert res.successful == ("0",), res
        event(f"delete of a {m.status} message")
        if m.status == PRESENT:
            self.leave(m, DELETED)

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 1000), recent=st.booleans(),
          timeout=st.one_of(st.integers(0, 60), st.just(0), st.just(43_201)))
    def change(self, i: int, recent: bool, timeout: int) -> None:
        self.settle()
        h = self._pick(i, recent)
        res = self.k.change(h.queue, h.text, timeout)
        assert isinstance(res, c.BatchResult), res
        m = self.msgs[(h.queue, h.mid)]
        want: ErrorCode | None = None
        if timeout > 43_200 or m.status != PRESENT or m.rc != h.epoch:
            want = ErrorCode.INVALID_PARAMETER_VALUE
        elif m.kind != IN_FLIGHT and self.queues[h.queue].fifo:
            want = ErrorCode.MESSAGE_NOT_INFLIGHT
        # (standard: the latest handle of a timed-out message still applies, as in SQS)
        if want is not None:
            (f,) = res.failed
            assert f.rejection.code is want, (f, m, h)
            if m.status == PRESENT and m.rc != h.epoch and timeout <= 43_200:
                assert "expired" in f.rejection.message
            event(f"change fails: {want.sqs_code}")
            return
        event(f"change to {min(timeout, 1)}+ s")
        assert res.successful == ("0",), res
        if timeout == 0:
            if m.kind == IN_FLIGHT:
                self.make_visible(m, self.now)
        else:
            m.kind, m.at = IN_FLIGHT, self.now + timeout * 1000

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 1000), garble=st.booleans())
    def foreign_handle(self, i: int, garble: bool) -> None:
        h = self.handles[i % len(self.handles)]
        others = [q for q in self.queues if q != h.queue]
        target = h.queue if garble or not others else others[i % len(others)]
        text = h.text[:-3] + ("AAA" if h.text[-3:] != "AAA" else "BBB") if garble else h.text
        for res in (self.k.delete(target, text), self.k.change(target, text, 0)):
            assert isinstance(res, c.BatchResult), res
            (f,) = res.failed
            assert f.rejection.code is ErrorCode.RECEIPT_HANDLE_IS_INVALID, f

    # ---- time, sweeps, purges, repeated creates ---------------------------------------------

    @rule(ms=st.one_of(st.integers(0, 40).map(lambda s: s * 1000),
                       st.integers(0, 400).map(lambda s: s * 1000),
                       st.integers(0, 400_000)))
    def advance(self, ms: int) -> None:
        self.k.now_ms += ms

    @rule()
    def sweep(self) -> None:
        self.settle()
        res = self.k.run(c.Sweep())
        assert res == c.Swept(more=False), res
        for m in self.msgs.values():
            if m.status == PRESENT:
                q = self.queues[m.queue]
                if m.expired(q, self.now):
                    event("sweep drops an expired message")
                    self.leave(m, EXPIRED)

    @rule(queue=st.sampled_from(ALL_QUEUES))
    def purge(self, queue: str) -> None:
        self.settle()
        res = self.k.run(c.PurgeQueue(queue))
        q = self.queues.get(queue)
        if q is None:
            assert rejection(res).code is ErrorCode.QUEUE_DOES_NOT_EXIST
            return
        if q.last_purge is not None and self.now - q.last_purge < 60_000:
            assert rejection(res).code is ErrorCode.PURGE_QUEUE_IN_PROGRESS
            return
        assert res == c.Ok(), res
        q.last_purge = self.now
        if q.fifo:  # a purge clears FIFO deduplication ids, as Amazon does; request ids stay
            q.dedup.clear()
        for m in self.present(queue):
            m.status = PURGED

    @rule(queue=st.sampled_from(ALL_QUEUES), same=st.booleans())
    def create_again(self, queue: str, same: bool) -> None:
        q = self.queues.get(queue)
        if q is None:
            return
        attrs = dict(q.raw_attrs)
        if not same:
            attrs["VisibilityTimeout"] = str(q.vis_s + 1)
        res = self.k.run(c.CreateQueue(queue, tuple(attrs.items())))
        if same:
            assert res == c.QueueCreated(queue), res
        else:
            assert rejection(res).code is ErrorCode.QUEUE_ALREADY_EXISTS

    # ---- invariants ----------------------------------------------------------------------

    @invariant()
    def counters_match_model(self) -> None:
        self.settle()
        for name in self.queues:
            counts = {DELAYED: 0, VISIBLE: 0, IN_FLIGHT: 0}
            for m in self.present(name):
                counts[m.kind] += 1
            want = (counts[VISIBLE], counts[IN_FLIGHT], counts[DELAYED])
            assert self.k.depth(name) == want, (name, self.k.depth(name), want)

    @invariant()
    def conservation(self) -> None:
        # Every accepted message is in exactly one state, and nothing appeared from nowhere.
        assert set(self.msgs) == self.accepted
        states = {PRESENT, DELETED, DEAD, EXPIRED, PURGED}
        for m in self.msgs.values():
            assert m.status in states
            assert m.status != PRESENT or m.kind in (DELAYED, VISIBLE, IN_FLIGHT)
        # A dead-lettered message lives on in the dead-letter queue under the same id.
        for (qname, mid), m in self.msgs.items():
            if m.status == DEAD:
                dlq = self.queues[qname].dlq
                assert dlq is not None and (dlq, mid) in self.msgs

    @invariant()
    def dedup_maps_to_one_message(self) -> None:
        for q in self.queues.values():
            live = [v[0] for v in q.dedup.values() if v[2] > self.now]
            for mid in live:
                assert (q.name, mid) in self.msgs


CoreModel.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoreModel = CoreModel.TestCase
