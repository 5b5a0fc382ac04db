"""The partition map on three etcd members: a client given all three endpoints keeps
reading, writing (guarded transactions too) and watching while any one member is down."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from etcdproc import EtcdProcess
from sqsq.control.etcd import Etcd
from sqsq.control.watch import watch_prefix


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[EtcdProcess]]:
    procs = [EtcdProcess(tmp_path / f"etcd{i}", name=f"etcd{i}") for i in (1, 2, 3)]
    everyone = ",".join(f"{p.name}={p.peer_url}" for p in procs)
    for p in procs:
        p.initial_cluster = everyone
        p.launch()
    try:
        for p in procs:
            p.wait_serving()
        yield procs
    finally:
        for p in procs:
            if p.proc is not None:
                p.stop()


def test_reads_writes_and_a_watch_go_on_while_any_one_member_is_down(
        members: list[EtcdProcess]) -> None:
    async def run() -> None:
        async with Etcd(",".join(m.endpoint for m in members), retry_for_s=10.0) as etcd:
            first = await etcd.put("/t/start", b"0")
            watch = watch_prefix(etcd, "/t/", first + 1)
            seen: list[str] = []

            async def follow() -> None:
                async for batch in watch:
                    seen.extend(e.key for e in batch.events)

            follower = asyncio.create_task(follow())
            for i, member in enumerate(members):
                member.proc.kill()  # one down at a time; the other two are a majority
                member.proc.wait()
                await etcd.put(f"/t/put-{i}", b"x")
                await etcd.compare_and_put(f"/t/cas-{i}", b"y", 0)
                assert (await etcd.get(f"/t/put-{i}")).value == b"x"
                member.start()
            deadline = asyncio.get_running_loop().time() + 20
            while len(seen) < 6 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
            await watch.close()
            follower.cancel()
            assert seen == [f"/t/{kind}-{i}" for i in range(3) for kind in ("put", "cas")]

    asyncio.run(run())
