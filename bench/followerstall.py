"""Whether a stall of both followers at once deposes a healthy leader: three ``sqsq node``
processes (as the ``sqsq-r3`` target starts them) under a steady trickle of batched sends;
both followers are stopped (SIGSTOP) for a while and continued, as a disk stall that blocks
their event loops in fsync would hold them (on one machine, one stall holds every node), and
each node's Raft term and leadership are read from its metrics afterwards.

    python -m bench.followerstall [--stall 0.3,0.7,1.2] [--tries 3]

It prints, for each stall, whether the leader was still the same one in the same term. A
leader stands down after two check-quorum rounds (0.5 s each) without a word from a
majority, so a stall under a second should leave it in place.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench.procs import Proc, free_port


def _raft(port: int) -> tuple[int, bool]:
    """(term, leads) of the node's one shard, from its /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    term, leads = 0, False
    for line in text.decode().splitlines():
        if line.startswith("sqsq_raft_term{"):
            term = int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("sqsq_raft_leader{"):
            leads = line.rsplit(" ", 1)[1].startswith("1")
    return term, leads


def _trickle(endpoint: str, stop: threading.Event) -> None:
    from sqsq.client import Client

    with Client(endpoint, timeout=30) as client:
        queue = client.create_queue("followerstall")
        batch = [{"Id": str(i), "MessageBody": "x" * 100} for i in range(10)]
        while not stop.is_set():
            try:
                client.send_message_batch(queue, batch)
            except Exception as e:  # noqa: BLE001 (a measuring tool: say so and go on)
                print(f"  a send failed: {type(e).__name__}: {str(e)[:80]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stall", default="0.3,0.7,1.2", help="seconds, comma-separated")
    ap.add_argument("--tries", type=int, default=3)
    args = ap.parse_args()
    stalls = [float(s) for s in args.stall.split(",")]
    with tempfile.TemporaryDirectory(prefix="sqsq-followerstall-") as tmp:
        root = Path(tmp)
        secret = root / "cluster-secret"
        secret.write_bytes(os.urandom(32))
        ports = [(free_port(), free_port(), free_port()) for _ in range(3)]
        peers = ",".join(f"127.0.0.1:{g}:{r}" for g, r, _ in ports)
        procs: list[Proc] = []
        stop = threading.Event()
        try:
            for i, (gport, rport, mport) in enumerate(ports):
                procs.append(Proc(f"sqsq-node{i}", [
                    sys.executable, "-m", "sqsq.cli.main", "node", "--data-dir",
                    str(root / f"node{i}"), "--host", "127.0.0.1", "--grpc-port", str(gport),
                    "--raft-port", str(rport), "--peers", peers, "--bootstrap",
                    "--metrics-port", str(mport), "--secret-file", str(secret)],
                    root / f"node{i}.log", env={"SQSQ_LOG_LEVEL": "WARNING"}))
            for proc, (gport, _, _) in zip(procs, ports, strict=True):
                proc.wait_port(gport)
            endpoint = ",".join(f"127.0.0.1:{g}" for g, _, _ in ports)
            threading.Thread(target=_trickle, args=(endpoint, stop), daemon=True).start()
            time.sleep(3)  # elected, and the trickle under way
            for stall in stalls:
                kept = 0
                for _ in range(args.tries):
                    before = [_raft(m) for _, _, m in ports]
                    leader = next(i for i, (_, leads) in enumerate(before) if leads)
                    followers = [p for i, p in enumerate(procs) if i != leader]
                    for p in followers:
                        os.kill(p.pid, signal.SIGSTOP)
                    time.sleep(stall)
                    for p in followers:
                        os.kill(p.pid, signal.SIGCONT)
                    time.sleep(2.5)  # any election settles
                    term, leads = _raft(ports[leader][2])
                    kept += leads and term == before[leader][0]
                print(f"followers stopped {stall:.2f} s: the leader kept its term "
                      f"{kept} of {args.tries} times")
        finally:
            stop.set()
            for p in procs:
                os.kill(p.pid, signal.SIGCONT)
                p.stop()


if __name__ == "__main__":
    main()
