"""The client-seen failover gap through a cluster's gateway.

    python -m bench.failover [--rounds 3] [--shards 1] [--stop kill|term]

Starts a cluster as ``sqsq cluster up`` does (etcd, three nodes, a gateway), has one SDK
client send one message at a time through the gateway, kills the shard's leader with -9
(``--stop term``: stops it with SIGTERM, so it hands its shards over first), and reports the
longest time between two acknowledged sends around the kill (the pause a client sees), the
sends that failed, and whether every acknowledged send was received. The killed node is
restarted before the next round. Prints one line per round and a summary.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from sqsq.cli.cluster import LocalCluster
from sqsq.client import Client
from sqsq.errors import QueueError


def one_round(cluster: LocalCluster, queue: str, stop_with: str = "kill") -> dict:
    acked: list[tuple[float, str]] = []
    failed: list[str] = []
    stop = threading.Event()

    def send() -> None:
        with Client(cluster.gateway.endpoint, timeout=30) as c:
            i = 0
            while not stop.is_set():
                body = f"{queue}-{i}"
                try:
                    c.send_message(queue, body)
                    acked.append((time.monotonic(), body))
                except QueueError as exc:
                    failed.append(type(exc).__name__)
                i += 1

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(2.0)  # a steady rate before the kill
    leader = cluster.status()["shards"][0]["leader"]
    victim = next(n for n in cluster.nodes if n.node_id == leader)
    killed_at = time.monotonic()
    if stop_with == "term":
        cluster.terminate(victim.proc)
    else:
        cluster.kill9(victim.proc)
    time.sleep(6.0)
    stop.set()
    sender.join()
    times = [t for t, _ in acked]
    around = [b - a for a, b in zip(times, times[1:], strict=False) if b >= killed_at]
    with Client(cluster.gateway.endpoint, timeout=30) as c:
        got: set[str] = set()
        empty = 0
        while empty < 3:
            msgs = c.receive_message(queue, max_number_of_messages=10, wait_time_seconds=1)
            empty = 0 if msgs else empty + 1
            for m in msgs:
                got.add(m.body)
                c.delete_message(queue, m.receipt_handle)
    cluster.start_node(victim)
    cluster.wait_ready()
    return {"gap_s": max(around) if around else float("nan"), "acked": len(acked),
            "failed": len(failed), "lost": len({b for _, b in acked} - got),
            "leader": leader}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--stop", choices=("kill", "term"), default="kill",
                        help="kill -9 the leader (default), or SIGTERM it (a graceful stop)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sqsq-failover-") as tmp:
        cluster = LocalCluster(Path(tmp), nodes=3, shards=args.shards).start()
        try:
            gaps = []
            how, what = ("stopped", "SIGTERM") if args.stop == "term" else ("killed", "kill -9")
            with Client(cluster.gateway.endpoint) as c:
                c.create_queue("failover")
            for r in range(args.rounds):
                res = one_round(cluster, "failover", args.stop)
                gaps.append(res["gap_s"])
                print(f"round {r + 1}: {how} leader {res['leader']}; longest pause between "
                      f"acknowledged sends {res['gap_s'] * 1000:.0f} ms; {res['acked']} "
                      f"acknowledged, {res['failed']} failed, {res['lost']} lost", flush=True)
            print(f"failover gap (client-seen, {what} of the leader): min "
                  f"{min(gaps) * 1000:.0f} ms, max {max(gaps) * 1000:.0f} ms over "
                  f"{len(gaps)} rounds")
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
