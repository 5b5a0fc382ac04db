"""The etcd wrapper against a real etcd: CAS, leases, elections and a watch across restarts."""

from __future__ import annotations

import asyncio
import time

import pytest

from etcdproc import EtcdProcess
from sqsq.control.etcd import (
    DOWN_WAIT_S,
    CasConflict,
    Etcd,
    EtcdUnavailable,
    mod_revision_is,
    put_op,
)
from sqsq.control.lease import Election, Lease, LeaseLost
from sqsq.control.watch import WatchBatch, watch_prefix


def run(coro, timeout_s: float = 60):  # noqa: ANN001, ANN201
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def test_compare_and_swap_detects_a_concurrent_writer(etcd_proc: EtcdProcess) -> None:
    async def scenario() -> None:
        async with Etcd(etcd_proc.endpoint) as a, Etcd(etcd_proc.endpoint) as b:
            first = await a.compare_and_put("/t/k", b"v1", 0)  # create
            with pytest.raises(CasConflict):
                await b.compare_and_put("/t/k", b"again", 0)  # exists already
            read_a = await a.get("/t/k")
            read_b = await b.get("/t/k")
            assert read_a is not None and read_b is not None
            assert read_a.mod_revision == first
            await a.compare_and_put("/t/k", b"from a", read_a.mod_revision)
            with pytest.raises(CasConflict) as lost:
                await b.compare_and_put("/t/k", b"from b", read_b.mod_revision)
            assert lost.value.current is not None and lost.value.current.value == b"from a"
            assert (await a.get("/t/k")).value == b"from a"  # type: ignore[union-attr]
            with pytest.raises(CasConflict):
                await b.compare_and_delete("/t/k", read_b.mod_revision)
            # A raw guarded transaction reports failure the same way.
            stale = await b.txn([mod_revision_is("/t/k", read_b.mod_revision)],
                                [put_op("/t/k", b"x")])
            assert not stale.succeeded

    run(scenario())


def test_racing_read_modify_writes_lose_no_update(etcd_proc: EtcdProcess) -> None:
    async def scenario() -> None:
        clients = [Etcd(etcd_proc.endpoint) for _ in range(4)]

        def bump(kv):  # noqa: ANN001, ANN202
            return str(int(kv.value) + 1 if kv else 1).encode()

        async def worker(client: Etcd) -> None:
            for _ in range(10):
                await client.update("/t/counter", bump, attempts=50)

        await asyncio.gather(*(worker(c) for c in clients))
        assert (await clients[0].get("/t/counter")).value == b"40"  # type: ignore[union-attr]
        for c in clients:
            await c.close()

    run(scenario())


def test_a_lease_kept_alive_outlives_its_ttl_and_expires_when_the_keepalive_stops(
        etcd_proc: EtcdProcess) -> None:
    async def scenario() -> None:
        async with Etcd(etcd_proc.endpoint) as node, Etcd(etcd_proc.endpoint) as observer:
            lease = await Lease.grant(node, 2)
            await node.put("/sqsq/nodes/n1", b"{}", lease=lease.id)
            start = time.monotonic()
            # Refreshes at a third of the TTL: four of them take the lease past its 2 s.
            while lease.refreshes < 4:
                await asyncio.sleep(0.05)
            assert time.monotonic() - start > 2
            assert await observer.get("/sqsq/nodes/n1") is not None
            assert lease.alive

            read = await observer.get_prefix("/sqsq/nodes/")
            watch = watch_prefix(observer, "/sqsq/nodes/", read.revision + 1)
            await lease.stop_keepalive()  # the node "crashes"
            stopped = time.monotonic()
            async for batch in watch:
                if any(ev.deleted and ev.key == "/sqsq/nodes/n1" for ev in batch.events):
                    break
            gone_after = time.monotonic() - stopped
            await watch.close()
            print(f"node key deleted {gone_after:.2f} s after its keepalive stopped (TTL 2 s)")
            assert gone_after < 6
            assert await observer.get("/sqsq/nodes/n1") is None

    run(scenario())


def test_a_lease_revoked_elsewhere_is_reported_lost(etcd_proc: EtcdProcess) -> None:
    async def scenario() -> None:
        async with Etcd(etcd_proc.endpoint) as node, Etcd(etcd_proc.endpoint) as operator:
            reasons: list[str] = []
            lease = await Lease.grant(node, 3, on_lost=reasons.append)
            await operator.revoke_lease(lease.id)
            await asyncio.wait_for(lease.lost.wait(), 5)
            assert reasons == ["etcd reports the lease expired"]
            with pytest.raises(LeaseLost):
                await Election(node, "/t/election", b"x", lease).try_acquire()

    run(scenario())


def test_election_passes_to_the_other_contender_when_the_holders_lease_ends(
        etcd_proc: EtcdProcess) -> None:
    async def scenario() -> None:
        async with Etcd(etcd_proc.endpoint) as a, Etcd(etcd_proc.endpoint) as b:
            lease_a = await Lease.grant(a, 5)
            lease_b = await Lease.grant(b, 5)
            ea = Election(a, "/sqsq/controller", b"node-a", lease_a)
            eb = Election(b, "/sqsq/controller", b"node-b", lease_b)
            token_a = await ea.campaign()
            b_waits = asyncio.create_task(eb.campaign())
            assert not await eb.try_acquire()
            holder = await eb.holder()
            assert holder is not None and holder.value == b"node-a"
            assert holder.create_revision == token_a
            # A fenced write by the holder goes through while it holds the key.
            assert (await a.txn([ea.guard()], [put_op("/t/fenced", b"a")])).succeeded

            await lease_a.revoke()  # the holder dies
            token_b = await asyncio.wait_for(b_waits, 10)
            holder = await ea.holder()
            assert holder is not None and holder.value == b"node-b"
            assert token_b > token_a and eb.is_holder and not ea.is_holder
            # The deposed holder's fenced write is refused.
            assert not (await a.txn([ea.guard()], [put_op("/t/fenced", b"stale")])).succeeded
            assert (await b.get("/t/fenced")).value == b"a"  # type: ignore[union-attr]

            await eb.resign()
            assert await eb.holder() is None
            await lease_b.revoke()

    run(scenario())


def test_a_watch_resumes_after_etcd_restarts_and_misses_nothing(
        etcd_proc: EtcdProcess) -> None:
    async def scenario() -> None:
        async with Etcd(etcd_proc.endpoint) as watcher, Etcd(etcd_proc.endpoint) as writer:
            start = await watcher.get_prefix("/t/")
            watch = watch_prefix(watcher, "/t/", start.revision + 1)
            seen: list[str] = []
            arrived = asyncio.Event()

            async def consume() -> None:
                async for batch in watch:
                    assert isinstance(batch, WatchBatch) and batch.reset is None
                    seen.extend(ev.kv.value.decode() for ev in batch.events if ev.kv)
                    arrived.set()

            async def until_seen(value: str) -> float:
                t0 = time.monotonic()
                while value not in seen:
                    arrived.clear()
                    await asyncio.wait_for(arrived.wait(), 20)
                return time.monotonic() - t0

            consumer = asyncio.create_task(consume())
            await writer.put("/t/a", b"before")
            await until_seen("before")
            for round_ in range(2):  # twice: the watch keeps resuming, not just once
                await asyncio.to_thread(etcd_proc.stop)
                # Written while etcd is down: put() waits for the connection and retries.
                during = asyncio.create_task(writer.put("/t/b", f"during-{round_}".encode()))
                await asyncio.to_thread(etcd_proc.start)
                serving = time.monotonic()
                await during
                await writer.put("/t/c", f"after-{round_}".encode())
                await until_seen(f"after-{round_}")
                print(f"round {round_}: event after restart arrived "
                      f"{time.monotonic() - serving:.2f} s after etcd served again")
            assert seen == ["before", "during-0", "after-0", "during-1", "after-1"]
            assert watch.restarts >= 2
            consumer.cancel()
            await watch.close()

    run(scenario(), timeout_s=120)


def test_once_etcd_is_found_unreachable_the_next_calls_give_up_sooner(
        etcd_proc: EtcdProcess) -> None:
    """The first call during an outage waits its whole budget for etcd; the next ones wait
    ``DOWN_WAIT_S`` only (a CreateQueue is refused in seconds, not after two whole budgets),
    until one gets through again."""
    async def scenario() -> None:
        async with Etcd(etcd_proc.endpoint, retry_for_s=4.0) as etcd:
            await etcd.put("/t/k", b"v")
            await asyncio.to_thread(etcd_proc.stop)
            took = []
            for _ in range(2):
                t0 = time.monotonic()
                with pytest.raises(EtcdUnavailable):
                    await etcd.get("/t/k")
                took.append(time.monotonic() - t0)
            assert took[0] >= 4.0 and took[1] < DOWN_WAIT_S + 1.0, took
            await asyncio.to_thread(etcd_proc.start)
            assert (await etcd.get("/t/k")).value == b"v"  # type: ignore[union-attr]
            assert not etcd.unreachable  # the whole budget again

    run(scenario())


def test_a_watch_that_cannot_resume_tells_its_client_that_etcd_is_unreachable(
        etcd_proc: EtcdProcess) -> None:
    """A gateway follows the map with a watch: once the watch finds etcd gone, the first
    CreateQueue is refused after ``DOWN_WAIT_S`` too, not after the whole budget."""
    async def scenario() -> None:
        async with Etcd(etcd_proc.endpoint, retry_for_s=30.0) as etcd:
            watch = watch_prefix(etcd, "/t/", 1)
            await asyncio.to_thread(etcd_proc.stop)
            async with asyncio.timeout(30):
                while not etcd.unreachable:
                    await asyncio.sleep(0.05)
            t0 = time.monotonic()
            with pytest.raises(EtcdUnavailable):
                await etcd.get("/t/k")
            assert time.monotonic() - t0 < DOWN_WAIT_S + 1.0
            await watch.close()
            await asyncio.to_thread(etcd_proc.start)

    run(scenario())


def test_a_watch_from_compacted_history_hands_over_the_whole_range(
        etcd_proc: EtcdProcess) -> None:
    async def scenario() -> None:
        from aetcd.rpc import rpc_pb2

        async with Etcd(etcd_proc.endpoint) as client:
            first = await client.put("/t/a", b"1")
            await client.put("/t/a", b"2")
            last = await client.put("/t/b", b"3")
            await client.kv.Compact(rpc_pb2.CompactionRequest(revision=last, physical=True))
            watch = watch_prefix(client, "/t/", first)  # that history is gone
            batch = await asyncio.wait_for(watch.__anext__(), 10)
            assert batch.reset is not None and batch.revision >= last
            assert {kv.key: kv.value for kv in batch.reset.kvs} == {"/t/a": b"2", "/t/b": b"3"}
            await client.put("/t/c", b"4")  # and it goes on from there
            batch = await asyncio.wait_for(watch.__anext__(), 10)
            assert [ev.key for ev in batch.events] == ["/t/c"]
            await watch.close()

    run(scenario())
