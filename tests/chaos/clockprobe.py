"""The clock-forward scenario's probe (stdlib + boto3 only, like ``driver.py``).

    python tests/chaos/clockprobe.py --endpoint http://IP:PORT --queue NAME --seconds N \\
        --out PATH [--visibility-timeout-s V]

Makes a queue with the shortest retention SQS allows (60 s) and a visibility timeout of V
seconds, sends one message a second and receives all the time without deleting, so every
message comes back every V seconds until its retention ends. Writes, for each message, when
its send was invoked and acknowledged and when each receive that returned it was invoked and
answered (``time.monotonic()``, comparable across processes on one machine); ``check`` turns
that into findings.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

RETENTION_S = 60


def run(args: argparse.Namespace) -> dict[str, Any]:
    from driver import make_client  # run as a script beside it, as the driver is

    client = make_client(args.endpoint)
    deadline = time.monotonic() + 30
    while True:
        try:
            url = client.create_queue(QueueName=args.queue, Attributes={
                "MessageRetentionPeriod": str(RETENTION_S),
                "VisibilityTimeout": str(args.visibility_timeout_s)})["QueueUrl"]
            break
        except Exception:  # noqa: BLE001 - a fault may be under way: try again
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    sends: dict[str, list[float]] = {}
    seen: dict[str, list[list[float]]] = {}
    stop = threading.Event()
    end = time.monotonic() + args.seconds

    def send() -> None:
        sender = make_client(args.endpoint)
        i = 0
        while not stop.wait(1.0):
            body = f"probe-{i}"
            i += 1
            invoked = time.monotonic()
            try:
                sender.send_message(QueueUrl=url, MessageBody=body)
            except Exception:  # noqa: BLE001 - unknown outcome: not checked
                continue
            sends[body] = [invoked, time.monotonic()]

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    while time.monotonic() < end:
        invoked = time.monotonic()
        try:
            got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                         WaitTimeSeconds=1).get("Messages", [])
        except Exception:  # noqa: BLE001 - a fault: receive again
            time.sleep(0.2)
            continue
        answered = time.monotonic()
        for m in got:
            seen.setdefault(m["Body"], []).append([invoked, answered])
    stop.set()
    thread.join(5)
    return {"end": time.monotonic(), "visibility_timeout_s": args.visibility_timeout_s,
            "retention_s": RETENTION_S, "sends": sends, "seen": seen}


def check(result: dict[str, Any], rate: float, fault_gap_s: float = 8.0) -> list[str]:
    """What the probe saw that the clock rule forbids. ``rate`` is the fastest the log's time
    may run against real time (1 + the rule's skew). A message must still be delivered when
    it is ``retention / rate - V - fault_gap_s`` seconds old (it comes back every V seconds;
    a fault may stop receives for a few); a message received again must have been hidden for
    ``V / rate`` seconds (from the first receive's invoke to the second's answer, which bound
    the two receives' log times)."""
    findings = []
    v = result["visibility_timeout_s"]
    alive_at = result["retention_s"] / rate - v - fault_gap_s
    for body, (_, acked) in result["sends"].items():
        sightings = sorted(result["seen"].get(body, []))
        if result["end"] - acked >= result["retention_s"] / rate:
            oldest = max((inv - acked for inv, _ in sightings), default=None)
            if oldest is None or oldest < alive_at:
                findings.append(f"{body}: gone early, last received at "
                                f"{'never' if oldest is None else f'{oldest:.1f} s'} of age "
                                f"(must still come back at {alive_at:.1f} s)")
        for (first, _), (_, again) in zip(sightings, sightings[1:], strict=False):
            if again - first < v / rate:
                findings.append(f"{body}: received again {again - first:.2f} s after a "
                                f"receive with a {v} s visibility timeout")
    return findings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--visibility-timeout-s", type=int, default=3)
    args = p.parse_args(argv)
    result = run(args)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
