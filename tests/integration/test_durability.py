"""kill -9 and SIGTERM restarts: every acknowledged send is still there afterwards."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from serverproc import ServerProcess
from sqsq.client import Client
from sqsq.errors import QueueError

N_SINGLE = 100
N_BATCHES = 10  # of 10 entries each


@contextmanager
def restarted(data_dir) -> Iterator[ServerProcess]:
    """A new server process on the same data directory (new ports), stopped afterwards."""
    srv = ServerProcess(data_dir).start()
    try:
        yield srv
    finally:
        srv.stop()


def _send_all(c: Client, url: str) -> dict[str, str]:
    """200 acknowledged messages: 100 single sends and 10 batches of 10; id -> body."""
    acked: dict[str, str] = {}
    for i in range(N_SINGLE):
        body = f"single {i} ✓"
        acked[c.send_message(url, body).message_id] = body
    for b in range(N_BATCHES):
        entries = [{"Id": f"e{i}", "MessageBody": f"batch {b}/{i}"} for i in range(10)]
        result = c.send_message_batch(url, entries)
        assert result.ok
        bodies = {e["Id"]: e["MessageBody"] for e in entries}
        for s in result.successful:
            acked[s.message_id] = bodies[s.id]
    assert len(acked) == N_SINGLE + 10 * N_BATCHES
    return acked


def _drain(c: Client, url: str, expected: int) -> dict[str, str]:
    got: dict[str, str] = {}
    handles = []
    for _ in range(expected // 10 + 20):
        batch = c.receive_message(url, max_number_of_messages=10, visibility_timeout=60,
                                  wait_time_seconds=0)
        if not batch:
            break
        for m in batch:
            assert m.message_id not in got, "delivered twice"
            got[m.message_id] = m.body
            handles.append(m.receipt_handle)
        if len(got) >= expected:
            break
    for i in range(0, len(handles), 10):
        result = c.delete_message_batch(
            url, [{"Id": str(j), "ReceiptHandle": h} for j, h in enumerate(handles[i:i + 10])])
        assert result.ok, result.failed
    return got


def _depth(c: Client, url: str) -> tuple[int, int, int]:
    a = c.get_queue_attributes(url)
    return (int(a["ApproximateNumberOfMessages"]), int(a["ApproximateNumberOfMessagesNotVisible"]),
            int(a["ApproximateNumberOfMessagesDelayed"]))


def test_kill9_loses_no_acknowledged_message(fresh_server: ServerProcess) -> None:
    with Client(fresh_server.endpoint) as c:
        url = c.create_queue("durable", {"VisibilityTimeout": "45"}, tags={"keep": "me"})
        acked = _send_all(c, url)
        # Some in flight at the crash, with handles issued before it.
        held = c.receive_message(url, max_number_of_messages=10, visibility_timeout=120)
        held += c.receive_message(url, max_number_of_messages=10, visibility_timeout=120)
        assert len(held) == 20
        fifo = c.create_queue("durable.fifo", {"FifoQueue": "true"})
        first = c.send_message(fifo, "once", message_group_id="g", message_deduplication_id="d")
    fresh_server.kill9()

    with restarted(fresh_server.data_dir) as srv, Client(srv.endpoint) as c:
        url = c.get_queue_url("durable")
        attrs = c.get_queue_attributes(url)
        assert attrs["VisibilityTimeout"] == "45"
        assert c.list_queue_tags(url) == {"keep": "me"}
        assert _depth(c, url) == (180, 20, 0)
        # The in-flight messages stay hidden; their pre-crash handles still delete them.
        rest = _drain(c, url, 180)
        assert len(rest) == 180
        for m in held:
            assert m.message_id not in rest
            c.delete_message(url, m.receipt_handle)
        everything = {**rest, **{m.message_id: m.body for m in held}}
        assert everything == acked
        assert _depth(c, url) == (0, 0, 0)
        # FIFO deduplication records survive the crash too.
        fifo = c.get_queue_url("durable.fifo")
        again = c.send_message(fifo, "once", message_group_id="g", message_deduplication_id="d")
        assert again.message_id == first.message_id
        got = c.receive_message(fifo, max_number_of_messages=10)
        assert [m.message_id for m in got] == [first.message_id]


def test_kill9_during_concurrent_sends(fresh_server: ServerProcess) -> None:
    """Senders keep sending while the server is killed: whatever was acknowledged survives."""
    with Client(fresh_server.endpoint) as c:
        url = c.create_queue("busy")
    acked: dict[str, str] = {}
    lock = threading.Lock()
    enough = threading.Event()
    stop = threading.Event()

    def sender(n: int) -> None:
        with Client(fresh_server.endpoint, timeout=5) as c:
            i = 0
            while not stop.is_set():
                body = f"sender {n} message {i}"
                try:
                    sent = c.send_message(url, body)
                except QueueError:
                    return  # the server is gone: this send was not acknowledged
                with lock:
                    acked[sent.message_id] = body
                    if len(acked) >= 150:
                        enough.set()
                i += 1

    threads = [threading.Thread(target=sender, args=(n,), daemon=True) for n in range(4)]
    for t in threads:
        t.start()
    assert enough.wait(30), "senders made no progress"
    fresh_server.kill9()
    stop.set()
    for t in threads:
        t.join(30)
    with lock:
        acknowledged = dict(acked)

    with restarted(fresh_server.data_dir) as srv, Client(srv.endpoint) as c:
        visible, in_flight, delayed = _depth(c, url)
        assert in_flight == delayed == 0
        assert visible >= len(acknowledged)
        got = _drain(c, url, visible)
        missing = set(acknowledged) - set(got)
        assert not missing, f"{len(missing)} acknowledged messages lost"
        for message_id, body in acknowledged.items():
            assert got[message_id] == body


def test_sigterm_exits_cleanly_and_keeps_data(fresh_server: ServerProcess) -> None:
    with Client(fresh_server.endpoint) as c:
        url = c.create_queue("graceful")
        acked = _send_all(c, url)
        held = c.receive_message(url, max_number_of_messages=5, visibility_timeout=120)
        assert len(held) == 5
    assert fresh_server.stop() == 0
    assert "stopped" in fresh_server.log_text()
    assert "Traceback" not in fresh_server.log_text()

    with restarted(fresh_server.data_dir) as srv, Client(srv.endpoint) as c:
        url = c.get_queue_url("graceful")
        assert _depth(c, url) == (195, 5, 0)
        rest = _drain(c, url, 195)
        for m in held:
            c.delete_message(url, m.receipt_handle)
        assert {**rest, **{m.message_id: m.body for m in held}} == acked
        assert _depth(c, url) == (0, 0, 0)
    assert srv.stop() == 0


def test_sigterm_with_a_parked_long_poll(fresh_server: ServerProcess) -> None:
    """A long poll in progress does not keep SIGTERM from ending the server promptly."""
    with Client(fresh_server.endpoint) as c:
        url = c.create_queue("parked")
        c.send_message(url, "kept")
        c.receive_message(url, visibility_timeout=600)  # in flight: the poll below finds none
        outcome: dict[str, object] = {}

        def poll() -> None:
            try:
                outcome["messages"] = c.receive_message(url, wait_time_seconds=20)
            except QueueError as e:
                outcome["error"] = e.code

        t = threading.Thread(target=poll, daemon=True)
        t.start()
        time.sleep(0.5)  # let the poll park
        start = time.monotonic()
        assert fresh_server.stop() == 0
        assert time.monotonic() - start < 10
        t.join(10)
        assert not t.is_alive()
        # Either an empty answer or "unavailable"; never a message.
        assert outcome.get("messages", []) == []
        assert outcome.get("error") in (None, "ServiceUnavailable")

    with restarted(fresh_server.data_dir) as srv, Client(srv.endpoint) as c:
        url = c.get_queue_url("parked")
        assert _depth(c, url) == (0, 1, 0)
        c.purge_queue(url)
        assert _depth(c, url) == (0, 0, 0)
