"""Many producers and consumers at once: nothing lost, nothing delivered twice while hidden."""

from __future__ import annotations

import threading
import time
from collections import Counter

from sqsq.client import Client

PRODUCERS = 8
PER_PRODUCER = 100
CONSUMERS = 4
TOTAL = PRODUCERS * PER_PRODUCER


def test_concurrent_producers_and_consumers(make_queue, door, client: Client) -> None:
    url = make_queue("conc", {"VisibilityTimeout": "30"})
    sent: dict[str, str] = {}
    deliveries: Counter[str] = Counter()
    bodies: dict[str, str] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    done = threading.Event()

    def produce(n: int) -> None:
        try:
            with Client(door.endpoint) as c:
                for i in range(PER_PRODUCER):
                    body = f"p{n}-{i}"
                    result = c.send_message(url, body)
                    with lock:
                        sent[result.message_id] = body
        except BaseException as e:
            errors.append(e)

    def consume() -> None:
        try:
            with Client(door.endpoint) as c:
                deadline = time.monotonic() + 60
                while not done.is_set() and time.monotonic() < deadline:
                    got = c.receive_message(url, max_number_of_messages=10, wait_time_seconds=1)
                    if not got:
                        continue
                    with lock:
                        for m in got:
                            deliveries[m.message_id] += 1
                            bodies[m.message_id] = m.body
                        if len(deliveries) >= TOTAL:
                            done.set()
                    result = c.delete_message_batch(url, [
                        {"Id": str(i), "ReceiptHandle": m.receipt_handle}
                        for i, m in enumerate(got)
                    ])
                    assert result.ok, result.failed
        except BaseException as e:
            errors.append(e)

    consumers = [threading.Thread(target=consume, daemon=True) for _ in range(CONSUMERS)]
    producers = [threading.Thread(target=produce, args=(n,), daemon=True)
                 for n in range(PRODUCERS)]
    start = time.monotonic()
    for t in consumers + producers:
        t.start()
    for t in producers:
        t.join(60)
    for t in consumers:
        t.join(65)
    elapsed = time.monotonic() - start
    assert not errors, errors
    assert len(sent) == TOTAL
    # No message lost, none delivered twice within its 30 s visibility timeout.
    assert set(deliveries) == set(sent), (len(deliveries), len(sent))
    twice = [mid for mid, n in deliveries.items() if n > 1]
    assert not twice, f"{len(twice)} messages delivered more than once"
    assert bodies == sent
    assert elapsed < 60
    a = client.get_queue_attributes(url)
    assert a["ApproximateNumberOfMessages"] == "0"
    assert a["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_concurrent_batch_producers(make_queue, door) -> None:
    """Batches from several threads: every entry gets one distinct message, all delivered."""
    url = make_queue("concbatch")
    ids: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            with Client(door.endpoint) as c:
                for b in range(5):
                    r = c.send_message_batch(url, [
                        {"Id": f"e{i}", "MessageBody": f"{n}/{b}/{i}"} for i in range(10)])
                    assert r.ok
                    with lock:
                        ids.extend(s.message_id for s in r.successful)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(ids) == len(set(ids)) == 200
    with Client(door.endpoint) as c:
        assert c.get_queue_attributes(url, ["ApproximateNumberOfMessages"]) == {
            "ApproximateNumberOfMessages": "200"}
        seen: set[str] = set()
        while True:
            got = c.receive_message(url, max_number_of_messages=10, wait_time_seconds=0)
            if not got:
                break
            for m in got:
                assert m.message_id not in seen
                seen.add(m.message_id)
        assert seen == set(ids)
