"""One client, one send at a time: the p50 and p90 of ``AsyncClient.send_message`` against a
running server, with the SDK's batching on and off, alternating (so both see the same
machine).

    python -m bench.c1 --endpoint 127.0.0.1:7400 --sends 600 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from sqsq.client import AsyncClient

WARM_UP = 50


async def one_round(endpoint: str, sends: int, batching: bool) -> tuple[float, float]:
    async with AsyncClient(endpoint, batching=batching) as client:
        url = await client.create_queue(f"bench-c1-{uuid.uuid4().hex[:8]}")
        try:
            for _ in range(WARM_UP):
                await client.send_message(url, "x" * 100)
            took = []
            for _ in range(sends):
                started = time.perf_counter()
                await client.send_message(url, "x" * 100)
                took.append(time.perf_counter() - started)
        finally:
            await client.delete_queue(url)
    took.sort()
    return took[len(took) // 2] * 1000, took[len(took) * 9 // 10] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", default="127.0.0.1:7400")
    ap.add_argument("--sends", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    for _ in range(args.rounds):
        for batching in (True, False):
            p50, p90 = asyncio.run(one_round(args.endpoint, args.sends, batching))
            print(f"batching {'on ' if batching else 'off'}  p50 {p50:.2f} ms  p90 {p90:.2f} ms")


if __name__ == "__main__":
    main()
