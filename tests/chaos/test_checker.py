"""The chaos checker on hand-written histories (each kind of violation caught, correct
histories with redeliveries, duplicates and unknown outcomes passing), on histories a model
of a correct queue generates (hypothesis), and on a real driver run against a real server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chaos.checker import Report, check, format_table, is_ok, load_history
from serverproc import ServerProcess, free_port

DRIVER = Path(__file__).with_name("driver.py")

STD, FIFO = "std", "q.fifo"


class Hist:
    """A history written by hand: every call advances the clock by 0.1 s."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.t = 0.0
        self.n = 0
        self.open: dict[str, dict[str, Any]] = {}

    def invoke(self, queue: str, op: str, req: dict[str, Any], process: str = "c0",
               phase: str = "load") -> str:
        self.n += 1
        self.t += 0.1
        e = {"type": "invoke", "id": f"{process}:{self.n}", "process": process, "phase": phase,
             "queue": queue, "op": op, "req": req, "t": self.t}
        self.events.append(e)
        self.open[e["id"]] = e
        return e["id"]

    def complete(self, op_id: str, kind: str = "ok", resp: dict[str, Any] | None = None,
                 at: float | None = None) -> None:
        e = self.open.pop(op_id)
        self.t = at if at is not None else self.t + 0.1
        out = {k: e[k] for k in ("id", "process", "phase", "queue", "op")}
        out.update(type=kind, t=self.t)
        out.update({"resp": resp or {}} if kind == "ok" else {"error": {"kind": "X"}})
        self.events.append(out)

    def call(self, queue: str, op: str, req: dict[str, Any], kind: str = "ok",
             resp: dict[str, Any] | None = None, process: str = "c0") -> str:
        op_id = self.invoke(queue, op, req, process)
        self.complete(op_id, kind, resp)
        return op_id

    def send(self, queue: str, body: str, kind: str = "ok", group: str | None = None,
             dedup: str | None = None) -> str:
        req: dict[str, Any] = {"body": body, "group": group, "dedup": dedup}
        return self.call(queue, "send", req, kind, {"message_id": "m-" + body})

    def receive(self, queue: str, *msgs: tuple[str, str, str], kind: str = "ok") -> str:
        """msgs: (message id, body, handle)."""
        resp = {"messages": [{"message_id": m, "body": b, "receipt_handle": h}
                             for m, b, h in msgs]}
        return self.call(queue, "receive", {"max": 10, "wait": 1}, kind, resp)

    def delete(self, queue: str, handle: str, kind: str = "ok") -> str:
        return self.call(queue, "delete", {"receipt_handle": handle}, kind)

    def drained(self, complete: bool = True) -> None:
        self.events.append({"type": "note", "note": "drain", "complete": complete,
                            "t": self.t})


def violations(r: Report) -> tuple[int, int, int, int]:
    return r.lost, r.unexpected, r.stale_deletes_accepted, r.fifo_violations


def test_clean_history_with_redelivery_and_rejected_stale_delete() -> None:
    h = Hist()
    h.send(STD, "a")
    h.receive(STD, ("m-a", "a", "h1"))
    h.receive(STD, ("m-a", "a", "h2"))  # visibility ran out: redelivered, new handle
    h.delete(STD, "h1", "fail")  # superseded handle refused, as it must be
    h.delete(STD, "h2")
    h.drained()
    r = check(h.events)
    assert is_ok(r) and violations(r) == (0, 0, 0, 0)
    assert (r.sends_acknowledged, r.redeliveries, r.stale_rejected) == (1, 1, 1)
    assert r.acknowledged == {"send": 1, "receive": 2, "delete": 1}
    assert r.drain_complete is True


def test_lost_acknowledged_send_is_caught() -> None:
    h = Hist()
    h.send(STD, "a")
    h.send(STD, "b")
    h.receive(STD, ("m-a", "a", "h1"))
    h.delete(STD, "h1")
    r = check(h.events)
    assert r.lost == 1 and not is_ok(r)
    assert "'b'" in r.details[0]


def test_unknown_and_failed_sends_are_not_lost() -> None:
    h = Hist()
    h.send(STD, "unknown-missing", "info")
    h.send(STD, "unknown-found", "info")
    h.invoke(STD, "send", {"body": "killed-found"})  # no completion: the driver died
    h.send(STD, "refused", "fail")
    h.receive(STD, ("m1", "unknown-found", "h1"), ("m2", "killed-found", "h2"))
    h.delete(STD, "h1", "info")  # may or may not have deleted it
    h.delete(STD, "h2")
    h.drained()
    r = check(h.events)
    assert is_ok(r)
    assert (r.unknown_found, r.unknown_not_found, r.sends_acknowledged) == (2, 1, 0)


def test_batch_send_with_failed_entries() -> None:
    h = Hist()
    entries = [{"id": "e0", "body": "ok-entry"}, {"id": "e1", "body": "rejected"},
               {"id": "e2", "body": "server-fault"}]
    h.call(STD, "send_batch", {"entries": entries}, "ok", {
        "successful": [{"id": "e0", "message_id": "m0"}],
        "failed": [{"id": "e1", "code": "InvalidParameterValue", "sender_fault": True},
                   {"id": "e2", "code": "InternalError", "sender_fault": False}]})
    r = check(h.events)
    assert (r.lost, r.sends_acknowledged, r.unknown_not_found) == (1, 1, 1)  # e0 never seen
    h.receive(STD, ("m0", "ok-entry", "h0"), ("m2", "server-fault", "h2"))
    r = check(h.events)
    assert is_ok(r) and (r.unknown_found, r.failed_found) == (1, 0)


def test_unexpected_message_is_caught() -> None:
    h = Hist()
    h.receive(STD, ("m-x", "nobody-sent-this", "h1"))
    r = check(h.events)
    assert r.unexpected == 1 and not is_ok(r)


def test_duplicates_are_reported_not_failed() -> None:
    h = Hist()
    h.send(STD, "a")
    h.receive(STD, ("m-a", "a", "h1"), ("m-a2", "a", "h2"))  # one body, two MessageIds
    h.receive(STD, ("m-a", "a", "h3"))
    r = check(h.events)
    assert is_ok(r) and (r.duplicated, r.redeliveries) == (1, 1)


def test_accepted_stale_delete_is_caught() -> None:
    h = Hist()
    h.send(STD, "a")
    h.receive(STD, ("m-a", "a", "h1"))
    h.receive(STD, ("m-a", "a", "h2"))
    h.delete(STD, "h1")  # superseded by h2, yet accepted
    r = check(h.events)
    assert r.stale_deletes_accepted == 1 and not is_ok(r)


def test_accepted_stale_visibility_change_is_caught() -> None:
    h = Hist()
    h.send(FIFO, "a", group="g", dedup="d")
    h.receive(FIFO, ("m-a", "a", "h1"))
    h.receive(FIFO, ("m-a", "a", "h2"))
    h.call(FIFO, "change_visibility", {"receipt_handle": "h1", "timeout": 0})
    assert check(h.events).stale_deletes_accepted == 1


def test_stale_delete_of_an_already_deleted_message_is_excused() -> None:
    for kind in ("ok", "info"):
        h = Hist()
        h.send(STD, "a")
        h.receive(STD, ("m-a", "a", "h1"))
        h.receive(STD, ("m-a", "a", "h2"))
        h.delete(STD, "h2", kind)  # the current holder deletes it (or may have)
        h.delete(STD, "h1")  # deleting a gone message succeeds, as in SQS
        assert is_ok(check(h.events)), kind
    h = Hist()  # but a delete with the same stale handle excuses nothing
    h.send(STD, "a")
    h.receive(STD, ("m-a", "a", "h1"))
    h.receive(STD, ("m-a", "a", "h2"))
    h.delete(STD, "h1", "info")
    h.delete(STD, "h1")
    assert check(h.events).stale_deletes_accepted == 1


def test_stale_needs_a_proven_order() -> None:
    """A receive overlapping the handle's receive, or still running when the delete was
    invoked, does not prove the handle was superseded."""
    h = Hist()
    h.send(STD, "a")
    r1 = h.invoke(STD, "receive", {}, "c0")
    r2 = h.invoke(STD, "receive", {}, "c1")  # concurrent with r1
    h.complete(r1, "ok", {"messages": [{"message_id": "m-a", "body": "a",
                                        "receipt_handle": "h1"}]})
    d = h.invoke(STD, "delete", {"receipt_handle": "h1"})
    h.complete(r2, "ok", {"messages": [{"message_id": "m-a", "body": "a",
                                        "receipt_handle": "h2"}]})
    h.complete(d)
    assert is_ok(check(h.events))


def test_delivery_after_an_accepted_delete_is_reported() -> None:
    h = Hist()
    h.send(STD, "a")
    h.receive(STD, ("m-a", "a", "h1"))
    h.delete(STD, "h1", "info")  # unknown: a later delivery is no news
    h.receive(STD, ("m-a", "a", "h2"))
    h.delete(STD, "h2")
    assert check(h.events).resurrected == 0
    h.receive(STD, ("m-a", "a", "h3"))  # the acknowledged delete was undone
    r = check(h.events)
    assert r.resurrected == 1 and "resurrected" in r.details[0]


def test_info_receive_and_vanished_messages() -> None:
    h = Hist()
    h.send(STD, "a")
    h.send(STD, "b")
    h.receive(STD, ("m-a", "a", "h0"), kind="info")  # the client never saw it
    h.receive(STD, ("m-a", "a", "h1"), ("m-b", "b", "h2"))
    h.delete(STD, "h1", "info")
    r = check(h.events)
    assert is_ok(r) and r.drain_complete is None  # no drain: b may still be in the queue
    h.drained(complete=False)
    assert is_ok(check(h.events))
    h.drained()  # the drain emptied the queues, yet b was never deleted: it vanished
    r = check(h.events)
    assert r.lost == 1 and "m-b" in r.details[0]


def test_fifo_order_inversion_is_caught() -> None:
    h = Hist()
    h.send(FIFO, "a", group="g", dedup="da")
    h.send(FIFO, "b", group="g", dedup="db")  # invoked after a was acknowledged
    h.receive(FIFO, ("m-b", "b", "h1"))
    h.receive(FIFO, ("m-a", "a", "h2"))
    r = check(h.events)
    assert r.fifo_order_inversions == 1 and not is_ok(r)
    h = Hist()  # the same inversion inside one response
    h.send(FIFO, "a", group="g", dedup="da")
    h.send(FIFO, "b", group="g", dedup="db")
    h.receive(FIFO, ("m-b", "b", "h1"), ("m-a", "a", "h2"))
    assert check(h.events).fifo_order_inversions == 1


def test_fifo_orders_that_are_not_inversions() -> None:
    h = Hist()
    h.send(FIFO, "a", group="g", dedup="da")
    h.send(FIFO, "b", group="g", dedup="db")
    h.send(FIFO, "x", group="other", dedup="dx")
    h.receive(FIFO, ("m-x", "x", "h0"), ("m-a", "a", "h1"), ("m-b", "b", "h2"))
    h.receive(FIFO, ("m-a", "a", "h3"))  # redelivery of a after b: fine
    sa = h.invoke(FIFO, "send", {"body": "c", "group": "g", "dedup": "dc"})
    h.send(FIFO, "d", group="g", dedup="dd")  # concurrent with c: no order between them
    h.complete(sa, "ok", {"message_id": "m-c"})
    h.receive(FIFO, ("m-d", "d", "h4"), ("m-c", "c", "h5"))
    assert is_ok(check(h.events))


def test_fifo_dedup_violation_is_caught() -> None:
    h = Hist()
    h.send(FIFO, "a", "info", group="g", dedup="da")
    h.send(FIFO, "a", "ok", group="g", dedup="da")  # the retry with the same dedup id
    h.receive(FIFO, ("m-1", "a", "h1"))
    h.delete(FIFO, "h1")
    h.receive(FIFO, ("m-2", "a", "h2"))  # delivered again as a second message
    r = check(h.events)
    assert (r.fifo_dedup_violations, r.duplicated) == (1, 1) and not is_ok(r)
    h = Hist()  # two bodies, one dedup id: the second must be dropped, not delivered
    h.send(FIFO, "a", group="g", dedup="d")
    h.send(FIFO, "b", group="g", dedup="d")
    h.receive(FIFO, ("m-a", "a", "h1"))
    r = check(h.events)
    assert is_ok(r) and r.deduplicated_sends == 1
    h.receive(FIFO, ("m-b", "b", "h2"))
    assert check(h.events).fifo_dedup_violations == 1


def test_fifo_dedup_window_expired() -> None:
    h = Hist()
    h.send(FIFO, "a", "info", group="g", dedup="da")
    h.t += 400  # a retry after the 5-minute window may legitimately make a second message
    h.send(FIFO, "a", "ok", group="g", dedup="da")
    h.receive(FIFO, ("m-1", "a", "h1"), ("m-2", "a", "h2"))
    r = check(h.events)
    assert is_ok(r) and r.duplicated == 1


def test_longest_unavailability() -> None:
    h = Hist()
    h.send(STD, "a")  # ok at 0.2
    op = h.invoke(STD, "send", {"body": "b"})  # 0.3
    h.complete(op, "info", at=4.3)
    h.call(STD, "send", {"body": "c"}, "fail")  # 4.4 .. 4.5
    h.send(STD, "d")  # ok at 4.7: 4.4 s after the first attempt since 0.2
    h.receive(STD, ("m-a", "a", "h"), ("m-c", "c", "h2"), ("m-d", "d", "h3"))
    assert check(h.events).max_unavailable_s == pytest.approx(4.4)
    d = h.invoke(STD, "receive", {}, phase="drain")  # phases are judged apart
    h.complete(d, "ok", {"messages": []}, at=5.0)
    assert check(h.events).max_unavailable_s == pytest.approx(4.4)


def test_client_gaps_are_each_clients_own() -> None:
    """One client served all along keeps the suite's measure low; the other's wait shows in
    its own gap. The driver's queue setup and the drain are no clients."""
    h = Hist()
    h.call(STD, "get_queue_url", {"name": STD}, process="setup")
    stuck = h.invoke(STD, "send", {"body": "a"}, process="c1")  # 0.3
    for k in range(30):  # c0: each call answered in 0.1 s
        h.call(STD, "send", {"body": f"b{k}"}, process="c0")
    h.complete(stuck, "fail")  # 6.4
    h.call(STD, "send", {"body": "c"}, process="c1")  # ok at 6.6: 6.3 s after 0.3
    d = h.invoke(STD, "receive", {}, process="drain", phase="drain")
    h.complete(d, "ok", {"messages": []})
    r = check(h.events)
    assert r.max_unavailable_s == pytest.approx(0.3)  # c0's last answer to c1's
    assert r.client_gaps_s == {"c0": pytest.approx(0.1), "c1": pytest.approx(6.3)}


def test_a_runs_doc_lists_each_clients_longest_gap(tmp_path: Path) -> None:
    from chaos.chaosrun import Outcome, write_doc
    r = Report(client_gaps_s={"c0": 1.5, "c1": 0.25})
    write_doc(tmp_path / "run.md", [Outcome("kill-leader", 3, r, 0, 60.0)], "the command")
    assert "| kill-leader | 1.50 | 0.25 / 1.50 |" in (tmp_path / "run.md").read_text()


def test_format_table() -> None:
    bad = Report(lost=2, acknowledged={"send": 5})
    text = format_table([("leader-kill", 3, Report()), ("partition", 1, bad)])
    lines = text.splitlines()
    assert "lost" in lines[0] and "stale deletes" in lines[0] and "FIFO" in lines[0]
    assert lines[2].split("|")[0].strip() == "leader-kill" and lines[2].endswith("ok")
    cells = [c.strip() for c in lines[3].split("|")]
    assert cells[:4] == ["partition", "1", "5", "2"] and cells[-1] == "FAIL"


def test_load_history_merges_and_skips_torn_lines(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"type": "note", "t": 1.0}) + "\n"
                 + json.dumps({"type": "note", "t": 3.0}) + "\n{\"type\": \"inv")
    b.write_text(json.dumps({"type": "note", "t": 2.0}) + "\n")
    assert [e["t"] for e in load_history(a, b)] == [1.0, 2.0, 3.0]


def run_driver(endpoint: str, history: Path, *args: str, timeout: float = 120,
               ) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(DRIVER), "--endpoint", endpoint, "--history", str(history),
           "--standard-queue", "chaos-std", "--fifo-queue", "chaos.fifo", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_real_driver_against_a_single_node_server_is_clean(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data").start()
    try:
        history = tmp_path / "history.jsonl"
        # A number of ops as well as a time: a slow machine makes fewer in 3 s, and the
        # rarer kinds (a visibility change needs a message held) may not come up at all.
        load = run_driver(srv.http_url, history, "--seconds", "3", "--seed", "7",
                          "--clients", "4", "--fifo-groups", "3", "--visibility-timeout-s", "2",
                          "--min-ops", "60")
        assert load.returncode == 0, load.stderr
        drain = run_driver(srv.http_url, history, "--drain", "--seconds", "60",
                           "--visibility-timeout-s", "2")
        assert drain.returncode == 0, drain.stderr
    finally:
        srv.stop()
    events = load_history(history)
    r = check(events)
    table = format_table([("single node", 0, r)])
    assert is_ok(r), (history, r.details, table)
    assert r.drain_complete is True, table
    assert r.sends_acknowledged > 10 and r.acknowledged["receive"] > 5, table
    assert r.failed_found == 0, r.details
    kinds = {e["op"] for e in events if e["type"] == "invoke"}
    assert {"send", "send_batch", "receive", "delete", "delete_batch",
            "change_visibility"} <= kinds
    assert {e["phase"] for e in events} == {"load", "drain"}
    done = {e["id"]: e for e in events if e["type"] in ("ok", "fail", "info")}
    assert all(e["id"] in done for e in events if e["type"] == "invoke")
    # a healthy server refuses nothing but handles that are stale or timed out
    refused = [e for e in done.values() if e["type"] == "fail"]
    assert all(e["op"] in ("delete", "change_visibility") and e["error"]["code"] in (
        "InvalidParameterValue", "ReceiptHandleIsInvalid",
        "AWS.SimpleQueueService.MessageNotInflight") or e["op"] == "get_queue_url" and
        e["error"]["code"] == "AWS.SimpleQueueService.NonExistentQueue"
        for e in refused), refused


def test_driver_records_refused_connections_as_fail(tmp_path: Path) -> None:
    history = tmp_path / "h.jsonl"
    out = run_driver(f"http://127.0.0.1:{free_port()}", history, "--seconds", "1.5")
    assert out.returncode == 2
    events = load_history(history)
    assert events and {e["type"] for e in events} == {"invoke", "fail"}
    assert all(e["error"]["kind"] == "EndpointConnectionError"
               for e in events if e["type"] == "fail")


def test_driver_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data").start()
    history = tmp_path / "h.jsonl"
    cmd = [sys.executable, str(DRIVER), "--endpoint", srv.http_url, "--history", str(history),
           "--standard-queue", "chaos-std", "--fifo-queue", "chaos.fifo", "--seconds", "120"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while (history.read_text().count("\n") if history.exists() else 0) < 50:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)  # polling for the driver's progress, not a clock in the checker
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        events = load_history(history)
        done = {e["id"] for e in events if e["type"] != "invoke"}
        assert all(e["id"] in done for e in events if e["type"] == "invoke")
        assert run_driver(srv.http_url, history, "--drain", "--seconds", "60").returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        srv.stop()
    r = check(load_history(history))
    assert is_ok(r) and r.drain_complete, r.details
