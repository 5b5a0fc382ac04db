"""The chaos checker against a model of a correct queue (hypothesis): concurrent clients,
requests applied at any point between invoke and completion or never, unknown outcomes,
visibility timeouts and redeliveries, FIFO retries with one deduplication id. Every history
the model makes passes; one violation injected into it is always caught."""

from __future__ import annotations

import copy
import random
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from chaos.checker import check, is_ok
from chaos.test_checker import FIFO, STD, Hist

V = 3.0  # visibility timeout of the model's queues, in model seconds


class Model:
    """A correct SQS: fenced handles, deduplication, FIFO groups blocked while in flight."""

    def __init__(self) -> None:
        self.msgs: dict[str, dict[str, Any]] = {}
        self.order: dict[str, list[str]] = {STD: [], FIFO: []}
        self.dedup: dict[str, str] = {}

    def sweep(self, now: float) -> None:
        for m in self.msgs.values():
            if m["state"] == "inflight" and m["until"] <= now:
                m["state"] = "visible"

    def live(self, queue: str) -> list[str]:
        return [mid for mid in self.order[queue] if self.msgs[mid]["state"] != "deleted"]

    def send(self, queue: str, req: dict[str, Any], now: float,
             rng: random.Random) -> dict[str, Any]:
        if req.get("dedup") in self.dedup:
            return {"message_id": self.dedup[req["dedup"]]}
        mid = f"m{len(self.msgs)}"
        self.msgs[mid] = {"body": req["body"], "group": req.get("group"), "state": "visible",
                          "epoch": 0, "until": 0.0}
        self.order[queue].append(mid)
        if req.get("dedup"):
            self.dedup[req["dedup"]] = mid
        return {"message_id": mid}

    def receive(self, queue: str, req: dict[str, Any], now: float,
                rng: random.Random) -> dict[str, Any]:
        live = self.live(queue)
        picks = [mid for mid in live if self.msgs[mid]["state"] == "visible"]
        if queue == FIFO:
            blocked = {self.msgs[mid]["group"] for mid in live
                       if self.msgs[mid]["state"] == "inflight"}
            picks = [mid for mid in picks if self.msgs[mid]["group"] not in blocked]
        else:
            rng.shuffle(picks)  # a standard queue promises no order
        out = []
        for mid in picks[: req["max"]]:
            m = self.msgs[mid]
            m["epoch"] += 1
            m["state"], m["until"] = "inflight", now + V
            out.append({"message_id": mid, "body": m["body"],
                        "receipt_handle": f"{mid}#{m['epoch']}"})
        return {"messages": out}

    def _current(self, handle: str) -> dict[str, Any] | None:
        mid, epoch = handle.split("#")
        m = self.msgs[mid]
        ok = int(epoch) == m["epoch"] and m["state"] == "inflight"
        return m if ok else None

    def delete(self, queue: str, req: dict[str, Any], now: float,
               rng: random.Random) -> dict[str, Any] | None:
        m = self.msgs[req["receipt_handle"].split("#")[0]]
        if m["state"] != "deleted":
            if self._current(req["receipt_handle"]) is None:
                return None  # superseded or timed out: refused
            m["state"] = "deleted"
        return {}  # deleting a deleted message succeeds

    def change_visibility(self, queue: str, req: dict[str, Any], now: float,
                          rng: random.Random) -> dict[str, Any] | None:
        m = self._current(req["receipt_handle"])
        if m is None:
            return None
        m["until"] = now + req["timeout"]
        if req["timeout"] == 0:
            m["state"] = "visible"
        return {}


def simulate(rng: random.Random, steps: int, clients: int = 3) -> list[dict[str, Any]]:
    h, model = Hist(), Model()
    pending: dict[int, list[Any]] = {}
    held: dict[int, list[tuple[str, str]]] = {c: [] for c in range(clients)}
    unknown_fifo: list[dict[str, Any]] = []

    def new_op(c: int) -> None:
        kind = rng.choice(["send", "fifo", "receive", "receive", "delete", "cmv"])
        if kind in ("delete", "cmv") and held[c]:
            queue, handle = held[c].pop(rng.randrange(len(held[c])))
            if kind == "cmv":
                req = {"receipt_handle": handle, "timeout": rng.choice([0, 1])}
                return begin(c, queue, "change_visibility", req)
            return begin(c, queue, "delete", {"receipt_handle": handle})
        if kind == "send":
            return begin(c, STD, "send", {"body": f"s{h.n}"})
        if kind == "fifo":
            if unknown_fifo and rng.random() < 0.5:
                return begin(c, FIFO, "send", unknown_fifo.pop())  # a retry, same dedup id
            req = {"body": f"f{h.n}", "group": rng.choice("ab"), "dedup": f"d{h.n}"}
            return begin(c, FIFO, "send", req)
        begin(c, rng.choice([STD, FIFO]), "receive", {"max": rng.randint(1, 3)})

    def begin(c: int, queue: str, op: str, req: dict[str, Any]) -> None:
        pending[c] = [h.invoke(queue, op, req, f"c{c}"), queue, op, req, False, None]

    def apply(p: list[Any]) -> None:
        model.sweep(h.t)
        p[4], p[5] = True, getattr(model, p[2])(p[1], p[3], h.t, rng)

    def finish(c: int, kind: str) -> None:
        op_id, queue, op, req, _, result = pending.pop(c)
        if kind == "ok" and result is None:
            kind = "fail"  # the model refused it
        h.complete(op_id, kind, result)
        if kind == "info" and op == "send" and queue == FIFO:
            unknown_fifo.append(req)
        if kind == "ok" and op == "receive":
            held[c].extend((queue, m["receipt_handle"]) for m in result["messages"])

    for _ in range(steps):
        h.t += rng.choice([0.0, 0.1, 0.5, 2.0])
        c = rng.randrange(clients)
        if c not in pending:
            new_op(c)
            continue
        p, roll = pending[c], rng.random()
        if not p[4] and roll < 0.6:
            apply(p)
        elif not p[4] and roll < 0.7:
            finish(c, "fail")  # refused before it was sent: never applied
        elif roll < 0.8:
            finish(c, "info")  # applied or not, the client cannot tell
        elif p[4]:
            finish(c, "ok")
    for c in list(pending):
        finish(c, "info")
    for _ in range(100):  # the drain: wait out every visibility timeout, take all
        if not model.live(STD) and not model.live(FIFO):
            break
        h.t += V + 1
        for queue in (STD, FIFO):
            op_id = h.invoke(queue, "receive", {"max": 10}, "drain", "drain")
            model.sweep(h.t)
            got = model.receive(queue, {"max": 10}, h.t, rng)
            h.complete(op_id, "ok", got)
            for m in got["messages"]:
                op_id = h.invoke(queue, "delete", {"receipt_handle": m["receipt_handle"]},
                                 "drain", "drain")
                model.delete(queue, {"receipt_handle": m["receipt_handle"]}, h.t, rng)
                h.complete(op_id, "ok", {})
    h.drained(complete=True)
    return h.events


@settings(max_examples=150, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(10, 300))
def test_correct_histories_pass(rng: random.Random, steps: int) -> None:
    events = simulate(rng, steps)
    r = check(events)
    assert is_ok(r), r.details
    assert r.drain_complete and r.duplicated == r.failed_found == r.resurrected == 0


def _responses(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "ok" and e["op"] == "receive"]


@settings(max_examples=120, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(30, 300),
       st.sampled_from(["lose", "unexpected", "stale"]))
def test_one_injected_violation_is_caught(rng: random.Random, steps: int, kind: str) -> None:
    events = copy.deepcopy(simulate(rng, steps))
    responses = _responses(events)
    if kind == "lose":  # an acknowledged message disappears from every response
        acked = [e["req"]["body"] for e in events if e["type"] == "invoke" and e["op"] == "send"
                 and any(x.get("id") == e["id"] and x["type"] == "ok" for x in events)]
        assume(acked)
        body = rng.choice(acked)
        for e in responses:
            e["resp"]["messages"] = [m for m in e["resp"]["messages"] if m["body"] != body]
        assert check(events).lost >= 1
    elif kind == "unexpected":
        assume(responses)
        rng.choice(responses)["resp"]["messages"].append(
            {"message_id": "ghost", "body": "never-sent", "receipt_handle": "ghost#1"})
        assert check(events).unexpected >= 1
    else:  # a superseded handle deletes right after the receive that superseded it
        index = {e["id"]: i for i, e in enumerate(events) if e["type"] == "invoke"}
        seen: dict[str, tuple[str, int]] = {}  # message id -> (handle, its receive completed)
        chances = []
        for i, e in enumerate(events):
            if e["type"] == "ok" and e["op"] == "receive":
                for m in e["resp"]["messages"]:
                    old = seen.get(m["message_id"])
                    if old and index[e["id"]] > old[1]:
                        chances.append((i, e["queue"], old[0]))
                    seen[m["message_id"]] = (m["receipt_handle"], i)
        assume(chances)
        at, queue, handle = rng.choice(chances)
        mid = handle.split("#")[0]
        assume(not any(e["type"] == "invoke" and e["op"] in ("delete", "change_visibility")
                       and e["req"]["receipt_handle"].startswith(mid + "#")
                       for e in events[:at]))
        t = events[at]["t"]
        events[at + 1:at + 1] = [
            {"type": "invoke", "id": "x:1", "process": "x", "queue": queue, "op": "delete",
             "req": {"receipt_handle": handle}, "t": t},
            {"type": "ok", "id": "x:1", "process": "x", "queue": queue, "op": "delete",
             "resp": {}, "t": t}]
        assert check(events).stale_deletes_accepted >= 1
