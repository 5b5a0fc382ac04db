"""State for a replica to catch up on: big messages sent to a queue no checker reads.

    python tests/chaos/filler.py --endpoint http://IP:PORT --queue NAME --mib 16 [--purge]

Sends ``--mib`` MiB in messages of 512 KiB (retried until each is acknowledged), or with
``--purge`` empties the queue again (waiting out the minute SQS allows between two purges).
Run in the client namespace (stdlib + boto3 only).
The queue has one partition per shard, so each shard holds about its share.
"""

from __future__ import annotations

import argparse
import sys
import time

import boto3
from botocore.config import Config

MESSAGE_BYTES = 512 * 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--mib", type=int, default=16)
    p.add_argument("--purge", action="store_true")
    p.add_argument("--seconds", type=float, default=120.0, help="give up after this long")
    args = p.parse_args(argv)
    sqs = boto3.session.Session().client(
        "sqs", endpoint_url=args.endpoint, region_name="us-east-1", aws_access_key_id="chaos",
        aws_secret_access_key="chaos",
        config=Config(retries={"total_max_attempts": 5, "mode": "standard"},
                      connect_timeout=2, read_timeout=20))
    deadline = time.monotonic() + args.seconds
    url = sqs.create_queue(QueueName=args.queue)["QueueUrl"]
    if args.purge:
        # One purge of a queue a minute, as in SQS: the scenario before this one may have
        # just purged it (PurgeQueueInProgress), and then this one waits its turn.
        while True:
            try:
                sqs.purge_queue(QueueUrl=url)
                return 0
            except sqs.exceptions.PurgeQueueInProgress:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)
    sent, n = 0, 0
    while sent < args.mib * 1024 * 1024:
        if time.monotonic() > deadline:
            print(f"filler: {sent} bytes sent before the deadline", file=sys.stderr)
            return 1
        body = f"fill-{n}-".ljust(MESSAGE_BYTES, "f")
        try:
            sqs.send_message(QueueUrl=url, MessageBody=body)
        except Exception as exc:  # noqa: BLE001 - state is all we want: try again
            print(f"filler: {exc}", file=sys.stderr)
            time.sleep(0.5)
            continue
        sent, n = sent + len(body), n + 1
    print(f"filler: {n} messages, {sent} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
