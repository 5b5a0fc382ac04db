"""Long polling over gRPC: wakes on a send, a delay ending, a visibility timeout ending.

Waiting here is the behaviour under test (a long poll's duration), not a stand-in for a
clock; every wait is a second or two.
"""

from __future__ import annotations

import threading
import time

from sqsq.client import Client


def _send_later(endpoint: str, url: str, body: str, after_s: float) -> threading.Thread:
    def run() -> None:
        time.sleep(after_s)
        with Client(endpoint) as other:
            other.send_message(url, body)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_long_poll_returns_as_soon_as_a_message_is_sent(
    client: Client, make_queue, door
) -> None:
    url = make_queue("lp-send")
    sender = _send_later(door.endpoint, url, "wake up", 0.5)
    start = time.monotonic()
    got = client.receive_message(url, wait_time_seconds=5)
    elapsed = time.monotonic() - start
    sender.join(5)
    assert [m.body for m in got] == ["wake up"]
    assert 0.3 <= elapsed < 3.0, elapsed


def test_long_poll_on_an_empty_queue_waits_then_returns_nothing(
    client: Client, make_queue
) -> None:
    url = make_queue("lp-empty")
    start = time.monotonic()
    got = client.receive_message(url, wait_time_seconds=1)
    elapsed = time.monotonic() - start
    assert got == []
    assert 0.9 <= elapsed < 3.0, elapsed


def test_short_poll_returns_at_once(client: Client, make_queue) -> None:
    url = make_queue("sp")
    start = time.monotonic()
    assert client.receive_message(url, wait_time_seconds=0) == []
    assert time.monotonic() - start < 0.9


def test_queue_default_wait_time_applies(client: Client, make_queue) -> None:
    url = make_queue("lp-default", {"ReceiveMessageWaitTimeSeconds": "1"})
    start = time.monotonic()
    assert client.receive_message(url) == []
    assert time.monotonic() - start >= 0.9


def test_long_poll_wakes_when_a_delayed_message_becomes_visible(
    client: Client, make_queue, depth
) -> None:
    url = make_queue("lp-delay")
    sent = client.send_message(url, "later", delay_seconds=1)
    assert depth(client, url) == (0, 0, 1)
    assert client.receive_message(url, wait_time_seconds=0) == []
    start = time.monotonic()
    got = client.receive_message(url, wait_time_seconds=5)
    elapsed = time.monotonic() - start
    assert [m.message_id for m in got] == [sent.message_id]
    assert elapsed < 3.0, elapsed


def test_long_poll_wakes_when_a_visibility_timeout_ends(
    client: Client, make_queue
) -> None:
    url = make_queue("lp-vis")
    sent = client.send_message(url, "comes back")
    first = client.receive_message(url, visibility_timeout=1)
    assert [m.message_id for m in first] == [sent.message_id]
    start = time.monotonic()
    got = client.receive_message(url, wait_time_seconds=5, attribute_names=["All"])
    elapsed = time.monotonic() - start
    assert [m.message_id for m in got] == [sent.message_id]
    assert got[0].attributes["ApproximateReceiveCount"] == "2"
    assert elapsed < 3.0, elapsed
    # The first handle is stale now; the new one deletes.
    client.delete_message(url, got[0].receipt_handle)


def test_several_long_polls_share_the_messages(
    client: Client, make_queue, door
) -> None:
    url = make_queue("lp-many")
    results: list[list[str]] = []
    lock = threading.Lock()

    def poll() -> None:
        with Client(door.endpoint) as c:
            got = c.receive_message(url, wait_time_seconds=4)
        with lock:
            results.append([m.body for m in got])

    pollers = [threading.Thread(target=poll, daemon=True) for _ in range(3)]
    for t in pollers:
        t.start()
    time.sleep(0.3)  # let the polls park
    start = time.monotonic()
    client.send_message_batch(url, [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(3)])
    for t in pollers:
        t.join(6)
    elapsed = time.monotonic() - start
    bodies = sorted(b for r in results for b in r)
    assert bodies == ["m0", "m1", "m2"]
    assert elapsed < 3.0, elapsed
