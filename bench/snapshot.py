"""What a snapshot costs the Raft tick thread, and what runs beside it (fix 7 in
``sqsq.shard.raft``): a shard's store filled with ``--messages`` waiting messages, then one
``ShardMachine.write_snapshot`` as log compaction calls it.

    python -m bench.snapshot --messages 200000 --body 1000

The tick thread (which sends heartbeats and commits entries) waits only for the checkpoint;
packing and fsyncing the dump file run in a thread of their own. Before fix 7 the tick thread
waited for both. A counting thread shows how much Python ran meanwhile (the checkpoint's
memtable flush releases the GIL).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from bench.apply import Replica
from sqsq.core import commands as c


def _fill(replica: Replica, queue: str, messages: int, body: int) -> None:
    """Send ``messages`` (rounded up to a hundred), a hundred per entry, with random bodies
    of ``body`` bytes (a repeated body would compress to nothing in the store)."""
    for _ in range(0, messages, 100):
        replica.apply([c.SendMessages(queue, tuple(
            c.SendEntry(str(i), os.urandom(body // 2 + 1).hex()[:body]) for i in range(10)),
            os.urandom(8).hex()) for _ in range(10)])


class _Counter:
    """A thread counting as fast as the GIL lets it: how much other Python ran."""

    def __init__(self) -> None:
        self.n = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            self.n += 1

    def rate(self, seconds: float) -> float:
        start = self.n
        time.sleep(seconds)
        return (self.n - start) / seconds

    def stop(self) -> None:
        self._stop = True
        self._thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--body", type=int, default=1000, help="bytes per message body")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        replica = Replica(Path(tmp) / "shard")
        replica.apply([c.Configure(replica.config.fingerprint())])
        replica.apply([c.CreateQueue("bench-snapshot")])
        _fill(replica, "bench-snapshot", args.messages, args.body)
        dump = str(Path(tmp) / "raft.dump")
        counter = _Counter()
        idle_rate = counter.rate(0.2)
        before, started = counter.n, time.perf_counter()
        write_file = replica.machine.write_snapshot(dump, b"")
        tick_s = time.perf_counter() - started
        others = (counter.n - before) / max(tick_s, 1e-9) / idle_rate
        counter.stop()
        started = time.perf_counter()
        write_file()
        beside_s = time.perf_counter() - started
        size = os.path.getsize(dump)
        replica.machine.close()
    print(f"{args.messages:,} messages, dump {size / 1e6:.0f} MB: the tick thread waited "
          f"{tick_s * 1000:.0f} ms (other Python ran at {others:.0%} of its idle pace "
          f"meanwhile); packing and fsyncing the dump took {beside_s * 1000:.0f} ms beside "
          f"it (before fix 7 the tick thread waited {(tick_s + beside_s) * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
