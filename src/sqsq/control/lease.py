"""Leases kept alive from a task, and a single-holder election built on one.

A ``Lease`` refreshes itself every third of its TTL. It counts as lost when etcd says it is
gone, or when no refresh has been answered for a whole TTL (measured from when the last
answered refresh was sent, so the local estimate never outlives etcd's own): a holder that
cannot prove its lease must assume it has lost it. Loss is reported through ``lost`` (an
event), ``lost_reason`` and an optional callback; the lease is then done for good, and its
owner registers again with a new one.

An ``Election`` is one key created under the candidate's lease by a transaction that
succeeds only while the key does not exist (create revision 0). The winner's create revision
is a fencing token: ``guard()`` is the compare that makes a later write conditional on still
holding the key. When the holder's lease ends, etcd deletes the key and the next campaigner
wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqsq.control.etcd import (
    Etcd,
    EtcdError,
    EtcdOutcomeUnknown,
    KeyValue,
    create_revision_is,
    delete_op,
    get_op,
    put_op,
)
from sqsq.control.watch import watch_key

log = logging.getLogger(__name__)

RETRY_INTERVAL_S = 0.2  # between keepalive attempts while etcd does not answer


class LeaseLost(EtcdError):
    """The lease this work depended on expired or could not be kept alive."""


class Lease:
    """A granted lease and the task keeping it alive. Make one with ``Lease.grant``."""

    def __init__(self, etcd: Etcd, lease_id: int, ttl_s: int, granted_at: float,
                 on_lost: Callable[[str], None] | None = None) -> None:
        self.etcd = etcd
        self.id = lease_id
        self.ttl_s = ttl_s
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self.refreshes = 0
        self._on_lost = on_lost
        self._last_ok = granted_at  # monotonic time the last answered request was sent
        self._task = asyncio.get_running_loop().create_task(self._keepalive())

    @classmethod
    async def grant(cls, etcd: Etcd, ttl_s: int, *,
                    on_lost: Callable[[str], None] | None = None) -> Lease:
        if ttl_s < 2:
            raise ValueError("a lease TTL below 2 s leaves no room for one retried refresh")
        sent = time.monotonic()
        lease_id = await etcd.grant_lease(ttl_s)
        return cls(etcd, lease_id, ttl_s, sent, on_lost)

    @property
    def alive(self) -> bool:
        return not self.lost.is_set()

    async def _keepalive(self) -> None:
        interval_s = self.ttl_s / 3
        while True:
            expires = self._last_ok + self.ttl_s
            await asyncio.sleep(max(0.0, self._last_ok + interval_s - time.monotonic()))
            while True:
                sent = time.monotonic()
                if sent >= expires:
                    self._mark_lost(f"no keepalive answered for {self.ttl_s} s")
                    return
                try:
                    ttl = await self.etcd.keepalive_once(self.id, within_s=expires - sent)
                except EtcdError as exc:
                    log.info("lease %x: keepalive failed: %s", self.id, exc)
                    await asyncio.sleep(min(RETRY_INTERVAL_S, max(0, expires - sent)))
                    continue
                if ttl <= 0:
                    self._mark_lost("etcd reports the lease expired")
                    return
                self._last_ok = sent
                self.refreshes += 1
                break

    def _mark_lost(self, reason: str) -> None:
        log.warning("lease %x lost: %s", self.id, reason)
        self.lost_reason = reason
        self.lost.set()
        if self._on_lost is not None:
            self._on_lost(reason)

    async def stop_keepalive(self) -> None:
        """Stop refreshing without revoking: the lease then expires in etcd by itself (what a
        crashed process looks like to everyone else)."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def revoke(self) -> None:
        """Give the lease up now: etcd deletes every key attached to it."""
        await self.stop_keepalive()
        await self.etcd.revoke_lease(self.id)
        if not self.lost.is_set():
            self.lost_reason = "revoked"
            self.lost.set()


@dataclass(frozen=True)
class Holder:
    value: bytes
    lease: int
    create_revision: int  # the holder's fencing token

    @classmethod
    def from_kv(cls, kv: KeyValue) -> Holder:
        return cls(kv.value, kv.lease, kv.create_revision)


class Election:
    """One contender for ``key``: ``campaign()`` until it wins, ``resign()`` to step down."""

    def __init__(self, etcd: Etcd, key: str, value: bytes, lease: Lease) -> None:
        self.etcd = etcd
        self.key = key
        self.value = value
        self.lease = lease
        self.revision: int | None = None  # our create revision while we hold the key

    @property
    def is_holder(self) -> bool:
        """What this contender believes; ``guard()`` makes a write check it in etcd."""
        return self.revision is not None and self.lease.alive

    def guard(self) -> Any:
        """The transaction compare that holds only while we still hold the key."""
        if self.revision is None:
            raise LeaseLost(f"not the holder of {self.key}")
        return create_revision_is(self.key, self.revision)

    async def holder(self) -> Holder | None:
        kv = await self.etcd.get(self.key)
        return Holder.from_kv(kv) if kv else None

    async def try_acquire(self) -> bool:
        """One attempt; True if we hold the key afterwards."""
        won, _ = await self._attempt()
        return won

    async def _attempt(self) -> tuple[bool, int]:
        """(won, the revision the key was seen at when we lost)."""
        if not self.lease.alive:
            raise LeaseLost(f"{self.key}: lease {self.lease.id:x} lost: {self.lease.lost_reason}")
        try:
            result = await self.etcd.txn([create_revision_is(self.key, 0)],
                                         [put_op(self.key, self.value, self.lease.id)],
                                         [get_op(self.key)])
        except EtcdOutcomeUnknown:
            # Read back: the key under our lease means the lost answer was a win.
            current = await self.etcd.range(self.key)
            kv = current.kvs[0] if current.kvs else None
            if kv is not None and kv.lease == self.lease.id:
                self.revision = kv.create_revision
                return True, current.revision
            return False, current.revision
        if result.succeeded:
            self.revision = result.revision
            return True, result.revision
        current_kv = next((KeyValue.from_pb(op.response_range.kvs[0]) for op in result.responses
                           if op.response_range.kvs), None)
        if current_kv is not None and current_kv.lease == self.lease.id:
            self.revision = current_kv.create_revision  # ours from an earlier attempt
            return True, result.revision
        return False, result.revision

    async def campaign(self) -> int:
        """Wait until we hold the key; returns our create revision (the fencing token).

        Raises ``LeaseLost`` if our lease ends while waiting.
        """
        while True:
            won, seen = await self._attempt()
            if won:
                assert self.revision is not None
                log.info("%s: won at revision %d", self.key, self.revision)
                return self.revision
            await self._wait_vacant(seen + 1)

    async def _wait_vacant(self, from_revision: int) -> None:
        watch = watch_key(self.etcd, self.key, from_revision)

        async def vacant() -> None:
            async for batch in watch:
                if batch.reset is not None and not batch.reset.kvs:
                    return
                if any(ev.deleted for ev in batch.events):
                    return

        waiter = asyncio.ensure_future(vacant())
        lost = asyncio.ensure_future(self.lease.lost.wait())
        try:
            await asyncio.wait({waiter, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiter, lost):
                task.cancel()
            await watch.close()
        if waiter.done() and not waiter.cancelled() and waiter.exception() is not None:
            raise waiter.exception()  # type: ignore[misc]
        if self.lease.lost.is_set():
            raise LeaseLost(f"{self.key}: lease lost while waiting: {self.lease.lost_reason}")

    async def resign(self) -> None:
        """Step down: delete the key if it is still our incarnation of it."""
        if self.revision is None:
            return
        revision, self.revision = self.revision, None
        await self.etcd.txn([create_revision_is(self.key, revision)], [delete_op(self.key)])
