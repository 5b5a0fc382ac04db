"""The one entry point of the shard state machine: ``apply(txn, config, command, now_ms)``.

Deterministic: it reads only the transaction, the command and ``now``; it writes only into
the transaction. ``now`` never goes backwards across applies (``max`` with the last applied
time), so a new leader with a slower clock cannot resurrect expired timers.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from sqsq.core import commands as c
from sqsq.core import delivery, fencing, keys, limits, queues, receiving, redrive, sending
from sqsq.core import records as r
from sqsq.core.state import ShardConfig, ShardState, Writer
from sqsq.errors import ErrorCode, reject


def _on_queue(
    fn: Callable[[ShardState, r.QueueRecord, c.Command, int], c.Outcome],
) -> Callable[[ShardState, c.Command, int], c.Outcome]:
    def run(st: ShardState, cmd: c.Command, now: int) -> c.Outcome:
        q = st.queue(cmd.queue)  # type: ignore[union-attr]
        if q is None:
            return c.Outcome(queues.queue_does_not_exist())
        return fn(st, q, cmd, now)

    return run


def _send(st: ShardState, q: r.QueueRecord, cmd: c.SendMessages, now: int) -> c.Outcome:
    rej = sending.check_batch(cmd)
    return c.Outcome(rej) if rej else sending.send(st, q, cmd, now)


def sweep(st: ShardState, cmd: c.Sweep, now: int) -> c.Outcome:
    """Bounded time-driven work; ``Swept.more`` asks the leader to sweep again soon."""
    budget = limits.SWEEP_MAX_ITEMS
    woken: list[c.WakeReceivers] = []
    if not st.meta.sweep_scheduled:  # state from before the schedule: enter every queue once
        for q in st.queues():
            st.schedule(q)
        st.meta.sweep_scheduled = 1
        return c.Outcome(c.Swept(more=True))  # their places are written with this command
    for key, qid, name in list(st.due_queues(now)):
        if budget <= 0:
            return c.Outcome(c.Swept(more=True), tuple(woken))
        q = st.queue(name)
        if q is None or q.qid != qid:  # deleted or purged since: the entry is stale
            st.txn.delete(key)
            continue
        budget -= 1  # a visit costs even when it finds nothing: the bound holds
        promoted = delivery.promote_due(st, q, now, budget)
        budget -= promoted
        if promoted:
            woken.append(c.WakeReceivers(q.name))
        budget -= delivery.drop_expired(st, q, now, budget)
        delivery.settle_floors(st, q)
        st.schedule(q)
    for task in redrive.running(st):
        if budget <= 0:
            return c.Outcome(c.Swept(more=True), tuple(woken))
        work, queues_woken = redrive.advance(st, task, now, budget)
        budget -= work
        woken.extend(c.WakeReceivers(n) for n in sorted(queues_woken))
    budget -= sending.expire_dedup(st, now, budget)
    for key, deleted_at in list(st.scan_prefix(b"x")):
        if now - keys.read_u64(deleted_at) >= limits.QUEUE_DELETED_RECENTLY_MS:
            st.txn.delete(key)
    for gkey, resume in list(st.scan_prefix(b"z")):
        # Resume after the last key deleted: rescanning from the prefix would wade through
        # this queue's own fresh tombstones on every sweep.
        qid = keys.read_u64(gkey, 1)
        for prefix in keys.QUEUE_SCOPED_PREFIXES:
            start = prefix + keys.u64(qid)
            if resume and resume[:1] > prefix[:1]:
                continue
            for key, _ in st.scan_prefix(start, max(start, resume or b"")):
                if budget <= 0:
                    st.txn.put(gkey, key)
                    return c.Outcome(c.Swept(more=True), tuple(woken))
                st.txn.delete(key)
                budget -= 1
        st.txn.delete(gkey)
    return c.Outcome(c.Swept(more=budget <= 0), tuple(woken))


def sweep_needed(st: ShardState, now: int) -> bool:
    """Whether a Sweep would change anything: a read-only check so idle shards write nothing.
    It reads the schedule's head, not every queue (a shard may hold thousands)."""
    if not st.meta.sweep_scheduled or any(True for _ in st.due_queues(now)):
        return True
    if any(True for _ in sending.due_dedup(st, now)) or any(True for _ in st.scan_prefix(b"z")):
        return True
    if redrive.running(st):
        return True
    return any(
        now - keys.read_u64(deleted_at) >= limits.QUEUE_DELETED_RECENTLY_MS
        for _, deleted_at in st.scan_prefix(b"x")
    )


def next_sweep_ms(st: ShardState) -> int | None:
    """The earliest time at which ``sweep_needed`` holds if nothing is applied meanwhile
    (0: it holds already, whatever the time; None: never). The leader reads it once after
    the state changes and then only compares the time, so an idle shard costs no reads."""
    if not st.meta.sweep_scheduled or redrive.running(st) or \
            any(True for _ in st.scan_prefix(b"z")):
        return 0
    due = [keys.read_u64(key, 1) for key, _ in itertools.islice(st.scan_prefix(b"S"), 1)]
    due += [keys.read_u64(key, 1) for key, _ in itertools.islice(
        st.scan_floored(b"e", st.meta.e_floor, None, lambda floor: None), 1)]
    due += [keys.read_u64(deleted_at) + limits.QUEUE_DELETED_RECENTLY_MS
            for _, deleted_at in st.scan_prefix(b"x")]
    return min(due, default=None)


def configure(st: ShardState, cmd: c.Configure, now: int) -> c.Outcome:
    """The first fingerprint recorded stays; a different one is refused (and the replica
    that proposed or applies it sees the mismatch and stops)."""
    recorded = st.txn.get(keys.CONFIG_KEY)
    if recorded is None:
        st.txn.put(keys.CONFIG_KEY, cmd.fingerprint.encode())
    elif recorded.decode() != cmd.fingerprint:
        return c.Outcome(reject(ErrorCode.INVALID_PARAMETER_VALUE,
                                "The cluster configuration differs from the recorded one."))
    return c.Outcome(c.Ok())


HANDLERS: dict[type, Callable[[ShardState, c.Command, int], c.Outcome]] = {
    c.CreateQueue: queues.create,
    c.DeleteQueue: queues.delete_queue,
    c.SetQueueAttributes: queues.set_attributes,
    c.PurgeQueue: queues.purge,
    c.TagQueue: queues.tag,
    c.UntagQueue: queues.untag,
    c.SendMessages: _on_queue(_send),
    c.ReceiveMessages: _on_queue(receiving.receive),
    c.DeleteMessages: _on_queue(fencing.delete),
    c.ChangeVisibilities: _on_queue(fencing.change_visibility),
    c.Sweep: sweep,
    c.Configure: configure,
    redrive.StartMoveTask: redrive.start,
    redrive.CancelMoveTask: redrive.cancel,
}


def apply(txn: Writer, config: ShardConfig, command: c.Command, now_ms: int) -> c.Outcome:
    st = ShardState(txn, config)
    now = max(now_ms, st.meta.last_now_ms)
    st.meta.last_now_ms = now
    outcome = HANDLERS[type(command)](st, command, now)
    st.flush()
    return outcome


# Commands on messages: they read queue records and never write one, and read the meta and
# counters only through their ShardState (no scan of the sweep schedule or the counters).
# A run of them in one entry shares one state (``apply_commands``).
SHARED_STATE = frozenset({c.SendMessages, c.ReceiveMessages, c.DeleteMessages,
                          c.ChangeVisibilities})


def apply_commands(txn: Writer, config: ShardConfig, commands: Iterable[c.Command],
                   now_ms: int) -> list[c.Outcome]:
    """``apply`` of each command in turn, as one log entry's: the same outcomes and the same
    state. A run of commands on messages (``SHARED_STATE``) shares one ShardState, so the
    meta, each queue's counters and record are read once and the meta and counters written
    once for the run, not once per command (a group commit's entry holds dozens); any other
    command gets its own state, after the run's is flushed (a Sweep reads the sweep schedule
    that flush writes)."""
    outcomes = []
    st: ShardState | None = None
    now = now_ms
    for command in commands:
        kind = type(command)
        if kind in SHARED_STATE:
            if st is None:
                st = ShardState(txn, config)
                st.share_queue_records()
                meta = st.meta
                now = max(now_ms, meta.last_now_ms)
                meta.last_now_ms = now
            outcomes.append(HANDLERS[kind](st, command, now))
        else:
            if st is not None:
                st.flush()
                st = None
            outcomes.append(apply(txn, config, command, now_ms))
    if st is not None:
        st.flush()
    return outcomes


def effective_now(txn: Writer, now_ms: int) -> int:
    """The time ``apply`` would use: queries read state as of the same clock."""
    return max(now_ms, r.Meta.decode(txn.get(keys.META_KEY)).last_now_ms)

