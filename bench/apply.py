"""What applying a committed entry costs one replica: CPU per message sent, received and
deleted through ``ShardMachine.apply_entry`` (what every replica of a shard does for every
entry), with no Raft, network or client in the way.

    python -m bench.apply --rounds 300 [--fifo] [--batch 1] [--profile]
    python -m bench.apply --matrix      # standard and FIFO, batches of 10 and of 1

Each round is three entries on one queue: ``--commands`` SendMessages of ``--batch``
messages each, as many ReceiveMessages of ``--batch``, and the DeleteMessages for what they
received. Only ``apply_entry`` is timed (the leader's stamp and the entry's encoding are
not), and each phase is printed per message. The entries are encoded in this process, so
``apply_entry`` finds them in ``core.entry``'s memo and decodes nothing, as a leader
applying its own entries does; a follower that applies an entry's commands itself decodes
it (about 1 us per message more in batches of 10, 3 in batches of 1). A FIFO queue's
messages go to ``--groups`` message groups in turn, each with its own deduplication id.
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
PHASES = ("send", "receive", "delete")


class Replica:
    """One store, fed entries as a leader would stamp them."""

    def __init__(self, directory: Path, *, fifo: bool, batch: int, commands: int,
                 groups: int) -> None:
        self.config = ShardConfig(shard_id=0, secret=secrets.token_bytes(32))
        self.machine = ShardMachine(directory, self.config)
        self.index = 0
        self.now = START_MS
        self.fifo, self.batch, self.commands, self.groups = fifo, batch, commands, groups
        self.queue = "bench-apply.fifo" if fifo else "bench-apply"
        self.sent = 0
        self.cpu = dict.fromkeys(PHASES, 0.0)
        self.profile: cProfile.Profile | None = None

    def apply(self, phase: str | None, commands: list[c.Command]) -> list[c.Outcome]:
        self.index += 1
        self.now += 1
        data = encode_entry(Entry(self.now, tuple(stamp(cmd) for cmd in commands)))
        if self.profile is not None:
            self.profile.enable()
        started = time.process_time()
        outcomes = self.machine.apply_entry(self.index, data)
        took = time.process_time() - started
        if self.profile is not None:
            self.profile.disable()
        if phase is not None:
            self.cpu[phase] += took
        assert outcomes is not None
        return outcomes

    def setup(self) -> None:
        self.apply(None, [c.Configure(self.config.fingerprint())])
        attributes = (("FifoQueue", "true"),) if self.fifo else ()
        self.apply(None, [c.CreateQueue(self.queue, attributes)])

    def _entry(self, i: int) -> c.SendEntry:
        self.sent += 1
        if not self.fifo:
            return c.SendEntry(str(i), "x" * 100)
        return c.SendEntry(str(i), "x" * 100, message_group_id=f"g{self.sent % self.groups}",
                           message_deduplication_id=str(self.sent))

    def round(self) -> None:
        n = self.batch
        self.apply("send", [c.SendMessages(self.queue, tuple(self._entry(i) for i in range(n)),
                                           secrets.token_hex(8))
                            for _ in range(self.commands)])
        received = self.apply("receive", [c.ReceiveMessages(self.queue, n, 30)
                                          for _ in range(self.commands)])
        got = sum(len(o.result.messages) for o in received)  # type: ignore[union-attr]
        assert got == n * self.commands, f"received {got} of {n * self.commands}"
        deleted = self.apply("delete", [c.DeleteMessages(self.queue, tuple(
            (str(i), m.receipt_handle) for i, m in enumerate(o.result.messages)))  # type: ignore[union-attr]
            for o in received])
        assert all(not o.result.failed for o in deleted)  # type: ignore[union-attr]


def run(rounds: int, *, fifo: bool, batch: int, commands: int, groups: int,
        profile: bool = False) -> dict[str, float]:
    """CPU seconds per message of each phase, and in all."""
    with tempfile.TemporaryDirectory() as tmp:
        replica = Replica(Path(tmp), fifo=fifo, batch=batch, commands=commands, groups=groups)
        replica.setup()
        for _ in range(20):  # warm up
            replica.round()
        replica.cpu = dict.fromkeys(PHASES, 0.0)
        replica.profile = cProfile.Profile() if profile else None
        for _ in range(rounds):
            replica.round()
        replica.machine.close()
    messages = rounds * commands * batch
    per = {phase: cpu / messages for phase, cpu in replica.cpu.items()}
    per["total"] = sum(per.values())
    if replica.profile is not None:
        pstats.Stats(replica.profile).sort_stats("tottime").print_stats(30)
    return per


def report(label: str, per: dict[str, float], messages: int) -> str:
    phases = ", ".join(f"{p} {per[p] * 1e6:.1f}" for p in PHASES)
    return (f"{label}: {per['total'] * 1e6:.1f} us of CPU per message ({phases}) over "
            f"{messages:,} messages")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--commands", type=int, default=10, help="commands per entry")
    ap.add_argument("--batch", type=int, default=10, help="messages per command (1-10)")
    ap.add_argument("--fifo", action="store_true", help="a FIFO queue")
    ap.add_argument("--groups", type=int, default=10, help="FIFO message groups")
    ap.add_argument("--matrix", action="store_true",
                    help="standard and FIFO, batches of 10 and of 1 (--rounds each)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the applies")
    args = ap.parse_args()
    variants = [(fifo, batch) for fifo in (False, True) for batch in (10, 1)] if args.matrix \
        else [(args.fifo, args.batch)]
    for fifo, batch in variants:
        per = run(args.rounds, fifo=fifo, batch=batch, commands=args.commands,
                  groups=args.groups, profile=args.profile)
        label = f"{'fifo' if fifo else 'standard'}, batches of {batch}"
        print(report(label, per, args.rounds * args.commands * batch)
              + (" (profiled)" if args.profile else ""), flush=True)


if __name__ == "__main__":
    main()
