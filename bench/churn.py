"""Cost per message after heavy churn: does receive+delete slow down as deletions pile up?

RocksDB keeps a tombstone for every deleted index entry until compaction; an index scan that
starts at the front of a queue's range walks through all of them. This drives the shard
engine directly (no gRPC, fsync off, so only the state machine and the store are measured)
through rounds of send 4,000 / receive+delete 4,000 on a standard and a FIFO queue and prints
each round's rate: flat rounds mean the cost does not grow with the number of deletions.

    python -m bench.churn [--rounds 5] [--batches 400]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time

from sqsq.core import commands as c
from sqsq.core.state import ShardConfig
from sqsq.shard.engine import ShardEngine
from sqsq.shard.store import RocksStore


async def churn(rounds: int, batches: int) -> None:
    path = tempfile.mkdtemp(prefix="sqsq-churn-")
    engine = ShardEngine(RocksStore(path), ShardConfig(), sync=False)
    await engine.start()
    try:
        await engine.execute(c.CreateQueue("standard"))
        await engine.execute(c.CreateQueue(
            "groups.fifo", (("FifoQueue", "true"), ("ContentBasedDeduplication", "true"))))
        for queue, group in (("standard", None), ("groups.fifo", "g")):
            for n in range(rounds):
                for i in range(batches):
                    await engine.execute(c.SendMessages(queue, tuple(
                        c.SendEntry(str(j), f"{n}-{i}-{j}", message_group_id=group)
                        for j in range(10))))
                started, done = time.perf_counter(), 0
                while True:
                    got = await engine.execute(c.ReceiveMessages(queue, 10, 30))
                    assert isinstance(got, c.Received)
                    if not got.messages:
                        break
                    done += len(got.messages)
                    await engine.execute(c.DeleteMessages(queue, tuple(
                        (str(i), m.receipt_handle) for i, m in enumerate(got.messages))))
                rate = done / (time.perf_counter() - started)
                print(f"{queue:12s} round {n}: {done} received+deleted, {rate:,.0f} msgs/s")
    finally:
        await engine.stop()
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=400, help="batches of 10 per round")
    args = ap.parse_args()
    asyncio.run(churn(args.rounds, args.batches))


if __name__ == "__main__":
    main()
