"""What applying a committed entry costs one replica: CPU per message sent, received and
deleted through ``ShardMachine.apply_entry`` (what every replica of a shard does for every
entry), with no Raft, network or client in the way.

    python -m bench.apply --rounds 300 [--profile]

Each round is three entries on one standard queue: ``--commands`` SendMessages of 10
messages, as many ReceiveMessages of 10, and the DeleteMessages for what they received.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import secrets
import tempfile
import time
from pathlib import Path

from sqsq.core import commands as c
from sqsq.core.entry import Entry, encode_entry
from sqsq.core.state import ShardConfig
from sqsq.shard.stamp import stamp
from sqsq.shard.statemachine import ShardMachine

START_MS = 1_700_000_000_000


class Replica:
    """One store, fed entries as a leader would stamp them."""

    def __init__(self, directory: Path) -> None:
        self.config = ShardConfig(shard_id=0, secret=secrets.token_bytes(32))
        self.machine = ShardMachine(directory, self.config)
        self.index = 0
        self.now = START_MS

    def apply(self, commands: list[c.Command]) -> list[c.Outcome]:
        self.index += 1
        self.now += 1
        data = encode_entry(Entry(self.now, tuple(stamp(cmd) for cmd in commands)))
        return self.machine.apply_entry(self.index, data)

    def round(self, queue: str, commands: int) -> None:
        self.apply([c.SendMessages(queue, tuple(c.SendEntry(str(i), "x" * 100)
                                                for i in range(10)), secrets.token_hex(8))
                    for _ in range(commands)])
        received = self.apply([c.ReceiveMessages(queue, 10, 30) for _ in range(commands)])
        self.apply([c.DeleteMessages(queue, tuple(
            (str(i), m.receipt_handle) for i, m in enumerate(o.result.messages)))
            for o in received])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--commands", type=int, default=10, help="commands per entry")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the rounds")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        replica = Replica(Path(tmp))
        replica.apply([c.Configure(replica.config.fingerprint())])
        replica.apply([c.CreateQueue("bench-apply")])
        for _ in range(20):  # warm up
            replica.round("bench-apply", args.commands)
        profile = cProfile.Profile() if args.profile else None
        if profile is not None:
            profile.enable()
        started = time.process_time()
        for _ in range(args.rounds):
            replica.round("bench-apply", args.commands)
        took = time.process_time() - started
        if profile is not None:
            profile.disable()
        replica.machine.close()
    messages = args.rounds * args.commands * 10
    print(f"{messages:,} messages sent, received and deleted: {took / messages * 1e6:.1f} us "
          f"of CPU per message ({took:.2f} s){' (profiled)' if profile else ''}")
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
