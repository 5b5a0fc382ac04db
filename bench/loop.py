"""The simplest client loop: send one message, receive it, delete it, again and again.

One request in flight, so every call waits for its own fsync: this is the latency floor of a
naive consumer, not the server's capacity (see ``python -m bench`` for that).

    python -m bench.loop [--endpoint 127.0.0.1:7400] [--count 2000]
"""

from __future__ import annotations

import argparse
import time
import uuid

from sqsq.client import Client


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default="127.0.0.1:7400", help="a running sqsq server")
    ap.add_argument("--count", type=int, default=2000, help="messages through the loop")
    args = ap.parse_args()
    with Client(args.endpoint) as sqs:
        queue = sqs.create_queue(f"loop-{uuid.uuid4().hex[:8]}")
        calls: dict[str, list[float]] = {"send": [], "receive": [], "delete": []}
        started = time.perf_counter()
        try:
            for _ in range(args.count):
                t0 = time.perf_counter()
                sqs.send_message(queue, "x" * 100)
                t1 = time.perf_counter()
                (message,) = sqs.receive_message(queue)
                t2 = time.perf_counter()
                sqs.delete_message(queue, message.receipt_handle)
                t3 = time.perf_counter()
                calls["send"].append(t1 - t0)
                calls["receive"].append(t2 - t1)
                calls["delete"].append(t3 - t2)
            elapsed = time.perf_counter() - started
        finally:
            sqs.delete_queue(queue)
    print(f"send+receive+delete loop: {args.count / elapsed:,.0f} messages/s "
          f"({elapsed / args.count * 1000:.2f} ms per message, 3 calls)")
    for op, seconds in calls.items():
        seconds.sort()
        print(f"  {op:8s} p50 {seconds[len(seconds) // 2] * 1000:.2f} ms  "
              f"p99 {seconds[int(len(seconds) * 0.99)] * 1000:.2f} ms")


if __name__ == "__main__":
    main()
