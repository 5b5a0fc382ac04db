"""A history-recording SQS load driver for the chaos suite (stdlib + boto3 only, never sqsq).

Run as its own process (later inside a network namespace)::

    python tests/chaos/driver.py --endpoint http://IP:PORT --history PATH --seconds N \\
        --seed S --clients K --standard-queue NAME --fifo-queue NAME.fifo \\
        [--fifo-groups G] [--visibility-timeout-s V] [--body-bytes MIN:MAX] [--drain]

Load mode: K client threads run a seeded random mix of SendMessage(Batch), ReceiveMessage,
DeleteMessage(Batch) and ChangeMessageVisibility on both queues for N seconds. FIFO sends
carry a group (G groups shared by all clients) and an explicit deduplication id; one whose
outcome is unknown is retried with the same id, as a real FIFO producer does. Clients also
exercise fencing on purpose: receive with a 1 s visibility timeout, wait it out, receive the
message again and then delete or change visibility with the OLD handle (which must fail).
``--drain`` mode receives and deletes until both queues stay empty for longer than the
visibility timeout (``--seconds`` bounds it) and then writes a ``drain`` note. Both modes
create the queues if missing and append to the same history. SIGTERM stops either cleanly.

Retries are off and timeouts short, so a fault shows up as a failed or unknown op.

``--body-bytes MIN:MAX`` sends bodies of MIN..MAX bytes (each batch within SQS's 1 MiB in
all). Such a body is its short name (what the history records: ``...|z<size>``), a ``|`` and
a padding fixed by its size; a received body whose padding is not exactly that is recorded
whole after a ``corrupt:`` mark, so the checker counts it unexpected (and its send lost).

History: JSON lines, appended and flushed one at a time, written under one lock in real-time
order (an invoke line is written before its request is sent, a completion line after its
response arrived). Every event has ``t`` (time.monotonic(), comparable across processes on
one machine), ``wall`` (time.time()), ``process`` (client name: ``c0``.. or ``drain``),
``phase`` (``load`` or ``drain``) and ``type``:

- ``invoke``: ``id`` (unique op id), ``queue`` (name), ``op``, ``req``.
- ``ok`` / ``fail`` / ``info``: same ``id``, ``queue``, ``op``; ``ok`` has ``resp``, the others
  ``error`` = {``kind`` (exception class), ``code`` (SQS error code or null), ``status``
  (HTTP status or null), ``message``}. ``fail``: definitely not applied (a 4xx answer, or
  the connection was never made). ``info``: outcome unknown (timeout after sending, 5xx,
  connection dropped). An op with no completion line (the driver was killed) is unknown too.
- ``note``: ``note`` = ``"drain"`` with ``complete`` (bool): the drain saw both queues empty
  for its whole quiet window (true) or hit its time bound (false).

Ops and their ``req`` / ``resp``:

- ``get_queue_url``: req {name}; resp {url}. ``create_queue`` (when it was missing): req
  {name, attributes}; resp {url}. ``queue_attributes``: req {names}; resp {attributes}.
- ``send``: req {body, group?, dedup?, attempt}; resp {message_id, sequence_number?}.
- ``send_batch``: req {entries: [{id, body, group?, dedup?}], attempt}; resp
  {successful: [{id, message_id, sequence_number?}], failed: [{id, code, sender_fault,
  message}]}.
- ``receive``: req {max, wait, visibility_timeout?}; resp {messages: [{message_id, body,
  receipt_handle, receive_count, sent_timestamp, sequence_number, group, dedup}]} (absent
  attributes are null).
- ``delete``: req {receipt_handle, message_id}; resp {}.
- ``delete_batch``: req {entries: [{id, receipt_handle, message_id}]}; resp as send_batch's
  without message ids.
- ``change_visibility``: req {receipt_handle, message_id, timeout}; resp {}.

``message_id`` in delete/change requests is what the client believed; checkers should map
the handle through the receive that returned it.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectTimeoutError, EndpointConnectionError

WAIT_S = 1  # long-poll wait: short, so a stop or a fault is noticed quickly
BATCH_MAX_BYTES = 1_048_576  # SQS: a batch's bodies together, as a single message's
PAD = "".join(chr(c) for c in range(ord("!"), ord("~") + 1) if chr(c) != "|")
PAD = PAD * (BATCH_MAX_BYTES // len(PAD) + 1)  # 93 symbols: a shift by one shows


def expand(short: str) -> str:
    """The body sent for a history's ``short`` one (itself unless it names a size)."""
    head, _, size = short.rpartition("|z")
    if not head or not size.isdigit():
        return short
    return short + "|" + PAD[: max(0, int(size) - len(short) - 1)]


def shrink(body: str) -> str:
    """The history's name of a received body: the short name if the body is exactly what
    ``expand`` makes of it, else the body itself marked corrupt."""
    if "|z" not in body:
        return body
    short = body.rpartition("|")[0]
    return short if expand(short) == body else "corrupt:" + body


class History:
    """Append-only JSON-lines writer; one lock orders lines in real time."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()

    def write(self, event: dict[str, Any]) -> None:
        with self._lock:
            if self._f.closed:
                return
            event["t"] = time.monotonic()
            event["wall"] = time.time()
            self._f.write(json.dumps(event, separators=(",", ":")) + "\n")
            self._f.flush()  # a kill -9 of the driver keeps every earlier line

    def close(self) -> None:
        with self._lock:
            self._f.close()


def make_client(endpoint: str, wait_s: int = WAIT_S) -> Any:
    cfg = Config(retries={"total_max_attempts": 1, "mode": "standard"},
                 connect_timeout=2, read_timeout=wait_s + 3, max_pool_connections=4)
    return boto3.session.Session().client(
        "sqs", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="chaos", aws_secret_access_key="chaos", config=cfg)


def classify(exc: Exception) -> tuple[str, dict[str, Any]]:
    """(fail | info, error): fail only when the request certainly had no effect."""
    err: dict[str, Any] = {"kind": type(exc).__name__, "code": None, "status": None,
                           "message": str(exc)[:300]}
    if isinstance(exc, ClientError):
        err["code"] = exc.response.get("Error", {}).get("Code")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        err["status"] = status
        return ("fail" if isinstance(status, int) and 400 <= status < 500 else "info"), err
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError)):
        return "fail", err  # no connection, so nothing was sent
    return "info", err  # read timeout, dropped connection, anything else: unknown


def _failed(raw: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"id": f["Id"], "code": f.get("Code"), "sender_fault": f.get("SenderFault"),
             "message": f.get("Message")} for f in raw.get("Failed", [])]


def _messages(raw: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for m in raw.get("Messages", []):
        a = m.get("Attributes", {})
        rc = a.get("ApproximateReceiveCount")
        out.append({"message_id": m["MessageId"], "body": shrink(m["Body"]),
                    "receipt_handle": m["ReceiptHandle"],
                    "receive_count": int(rc) if rc is not None else None,
                    "sent_timestamp": a.get("SentTimestamp"),
                    "sequence_number": a.get("SequenceNumber"),
                    "group": a.get("MessageGroupId"),
                    "dedup": a.get("MessageDeduplicationId")})
    return out


CONVERT: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "get_queue_url": lambda r: {"url": r["QueueUrl"]},
    "create_queue": lambda r: {"url": r["QueueUrl"]},
    "queue_attributes": lambda r: {"attributes": r.get("Attributes", {})},
    "send": lambda r: {"message_id": r["MessageId"], "sequence_number": r.get("SequenceNumber")},
    "send_batch": lambda r: {
        "successful": [{"id": s["Id"], "message_id": s["MessageId"],
                        "sequence_number": s.get("SequenceNumber")}
                       for s in r.get("Successful", [])],
        "failed": _failed(r)},
    "receive": lambda r: {"messages": _messages(r)},
    "delete": lambda r: {},
    "delete_batch": lambda r: {"successful": [{"id": s["Id"]} for s in r.get("Successful", [])],
                               "failed": _failed(r)},
    "change_visibility": lambda r: {},
}


@dataclass
class Held:
    queue: str
    message_id: str
    handle: str
    body: str


class Recorder:
    """One client's view: runs one SQS call as an op with an invoke and one completion."""

    def __init__(self, name: str, phase: str, history: History, client: Any,
                 urls: dict[str, str]) -> None:
        self.name, self.phase, self.history = name, phase, history
        self.client, self.urls, self.n = client, urls, 0
        self.unreachable = False  # the last op found no server: worth a short pause

    def op(self, queue: str, op: str, req: dict[str, Any],
           call: Callable[[], dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        self.n += 1
        base = {"id": f"{self.name}:{self.n}", "process": self.name, "phase": self.phase,
                "queue": queue, "op": op}
        self.history.write({**base, "type": "invoke", "req": req})
        try:
            resp = CONVERT[op](call())
        except Exception as exc:  # noqa: BLE001 - every outcome is recorded, none hidden
            kind, err = classify(exc)
            self.unreachable = not isinstance(exc, ClientError)
            self.history.write({**base, "type": kind, "error": err})
            return kind, err
        self.unreachable = False
        self.history.write({**base, "type": "ok", "resp": resp})
        return "ok", resp

    def send(self, queue: str, entries: list[dict[str, Any]], attempt: int) -> tuple[str, dict]:
        url, c = self.urls[queue], self.client

        def params(e: dict[str, Any]) -> dict[str, Any]:
            p = {"MessageBody": expand(e["body"])}
            if e.get("group") is not None:
                p.update(MessageGroupId=e["group"], MessageDeduplicationId=e["dedup"])
            return p

        if len(entries) == 1 and "id" not in entries[0]:
            return self.op(queue, "send", {**entries[0], "attempt": attempt},
                           lambda: c.send_message(QueueUrl=url, **params(entries[0])))
        batch = [{"Id": e["id"], **params(e)} for e in entries]
        return self.op(queue, "send_batch", {"entries": entries, "attempt": attempt},
                       lambda: c.send_message_batch(QueueUrl=url, Entries=batch))

    def receive(self, queue: str, max_n: int, wait: int,
                visibility: int | None = None) -> tuple[str, dict]:
        kw: dict[str, Any] = {"QueueUrl": self.urls[queue], "MaxNumberOfMessages": max_n,
                              "WaitTimeSeconds": wait, "MessageSystemAttributeNames": ["All"]}
        if visibility is not None:
            kw["VisibilityTimeout"] = visibility
        req = {"max": max_n, "wait": wait, "visibility_timeout": visibility}
        return self.op(queue, "receive", req, lambda: self.client.receive_message(**kw))

    def delete(self, held: list[Held]) -> tuple[str, dict]:
        q, url, c = held[0].queue, self.urls[held[0].queue], self.client
        if len(held) == 1:
            h = held[0]
            return self.op(q, "delete", {"receipt_handle": h.handle, "message_id": h.message_id},
                           lambda: c.delete_message(QueueUrl=url, ReceiptHandle=h.handle))
        entries = [{"id": f"e{i}", "receipt_handle": h.handle, "message_id": h.message_id}
                   for i, h in enumerate(held)]
        wire = [{"Id": e["id"], "ReceiptHandle": e["receipt_handle"]} for e in entries]
        return self.op(q, "delete_batch", {"entries": entries},
                       lambda: c.delete_message_batch(QueueUrl=url, Entries=wire))

    def change_visibility(self, h: Held, timeout: int) -> tuple[str, dict]:
        req = {"receipt_handle": h.handle, "message_id": h.message_id, "timeout": timeout}
        return self.op(h.queue, "change_visibility", req,
                       lambda: self.client.change_message_visibility(
                           QueueUrl=self.urls[h.queue], ReceiptHandle=h.handle,
                           VisibilityTimeout=timeout))


def held_from(queue: str, resp: dict[str, Any]) -> list[Held]:
    return [Held(queue, m["message_id"], m["receipt_handle"], m["body"])
            for m in resp.get("messages", [])]


class Worker:
    """One load client: a seeded random mix of ops until the deadline or a stop."""

    WEIGHTS = {"send": 14, "send_batch": 6, "fifo_send": 14, "fifo_send_batch": 4,
               "receive": 30, "delete": 14, "delete_batch": 6, "change_visibility": 6,
               "abandon": 2, "fence": 2}

    def __init__(self, idx: int, args: argparse.Namespace, rec: Recorder, stop: threading.Event,
                 deadline: float, seqs: dict[int, int], seq_lock: threading.Lock) -> None:
        self.idx, self.args, self.rec, self.stop, self.deadline = idx, args, rec, stop, deadline
        self.rng = random.Random(f"{args.seed}:{idx}")
        self.seqs, self.seq_lock = seqs, seq_lock
        self.held: list[Held] = []
        self.counter = 0
        self.ops = 0
        self.run_tag = args.run_tag

    def done(self) -> bool:
        return self.stop.is_set() or (time.monotonic() >= self.deadline
                                      and self.ops >= self.args.min_ops)

    def run(self) -> None:
        kinds, weights = list(self.WEIGHTS), list(self.WEIGHTS.values())
        while not self.done():
            self.ops += 1
            kind = self.rng.choices(kinds, weights)[0]
            if len(self.held) > 30:
                kind = "delete_batch"  # keep the backlog small so the drain is short
            if kind in ("delete", "delete_batch", "change_visibility", "abandon") \
                    and not self.held:
                kind = "receive"
            if "send" in kind:
                fifo = kind.startswith("fifo")
                self._send(fifo, self.rng.randint(2, 5 if fifo else 10) if "batch" in kind else 1)
            else:
                getattr(self, "do_" + kind)()
            if self.rec.unreachable:
                self.stop.wait(0.1)  # refused connections return at once: do not spin

    def _entry(self, fifo: bool, batch_id: str | None, n: int = 1) -> dict[str, Any]:
        self.counter += 1
        size = ""
        if self.args.body_bytes:
            low, high = self.args.body_bytes
            high = min(high, BATCH_MAX_BYTES // n)  # the batch within SQS's bound
            size = f"|z{self.rng.randint(min(low, high), high)}"
        e: dict[str, Any] = {}
        if batch_id is not None:
            e["id"] = batch_id
        if not fifo:
            e["body"] = f"{self.run_tag}|c{self.idx}|n{self.counter}|std" + size
            return e
        group = self.rng.randrange(self.args.fifo_groups)
        with self.seq_lock:
            self.seqs[group] = seq = self.seqs.get(group, 0) + 1
        e["body"] = f"{self.run_tag}|c{self.idx}|n{self.counter}|g{group}|s{seq}" + size
        e["group"] = f"g{group}"
        e["dedup"] = f"{self.run_tag}-c{self.idx}-n{self.counter}"
        return e

    def _send(self, fifo: bool, n: int) -> None:
        queue = self.args.fifo_queue if fifo else self.args.standard_queue
        entries = [self._entry(fifo, f"e{i}" if n > 1 else None, n) for i in range(n)]
        for attempt in range(4):
            kind, resp = self.rec.send(queue, entries, attempt)
            if not fifo or self.done():
                return  # standard sends are not retried: an unknown one stays unknown
            if kind == "ok" and n > 1:
                # entries the server failed on its side are unknown: retry those alone
                retry = {f["id"] for f in resp.get("failed", []) if not f.get("sender_fault")}
                entries = [e for e in entries if e["id"] in retry]
                if not entries:
                    return
            elif kind != "info":
                return
            self.stop.wait(0.2)

    def _queue(self) -> str:
        return self.rng.choice([self.args.standard_queue, self.args.fifo_queue])

    def do_receive(self) -> None:
        q = self._queue()
        kind, resp = self.rec.receive(q, self.rng.randint(1, 10), self.rng.choice([0, WAIT_S]))
        self.held.extend(held_from(q, resp))

    def _pop(self) -> Held:
        return self.held.pop(self.rng.randrange(len(self.held)))

    def do_delete(self) -> None:
        self.rec.delete([self._pop()])

    def do_delete_batch(self) -> None:
        first = self._pop()
        same = [h for h in self.held if h.queue == first.queue][: self.rng.randint(1, 9)]
        for h in same:
            self.held.remove(h)
        self.rec.delete([first, *same])

    def do_change_visibility(self) -> None:
        h = self._pop()
        timeout = self.rng.choice([0, 0, 1, self.args.visibility_timeout_s])
        self.rec.change_visibility(h, timeout)
        if timeout:
            self.held.append(h)  # still ours for a while; 0 released it

    def do_abandon(self) -> None:
        self._pop()  # never deleted: it must come back after its visibility timeout

    def do_fence(self) -> None:
        """Keep a handle past its timeout, receive the message again, use the old handle."""
        q = self._queue()
        kind, resp = self.rec.receive(q, 1, WAIT_S, visibility=1)
        got = held_from(q, resp)
        if not got:
            return
        old = got[0]
        self.stop.wait(1.3)
        again: Held | None = None
        for _ in range(4):
            if self.done():
                break
            kind, resp = self.rec.receive(q, 10, WAIT_S)
            for h in held_from(q, resp):
                if h.message_id == old.message_id and again is None:
                    again = h
                else:
                    self.held.append(h)
            if again is not None:
                break
        if self.rng.random() < 0.5:
            self.rec.delete([old])  # must be rejected if `again` superseded it
        else:
            self.rec.change_visibility(old, self.rng.choice([0, 1]))
        self.held.append(again or old)


MISSING = ("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue")


def ensure_queues(rec: Recorder, args: argparse.Namespace, stop: threading.Event,
                  deadline: float) -> dict[str, int] | None:
    """Find both queues, creating a missing one (retried until the deadline); returns their
    visibility timeouts (an existing queue keeps its own)."""
    vis = str(args.visibility_timeout_s)
    specs = {args.standard_queue: {"VisibilityTimeout": vis},
             args.fifo_queue: {"VisibilityTimeout": vis, "FifoQueue": "true"}}
    c, timeouts = rec.client, {}
    for name, attrs in specs.items():
        while name not in timeouts:
            kind, resp = rec.op(name, "get_queue_url", {"name": name},
                                lambda n=name: c.get_queue_url(QueueName=n))
            if kind == "fail" and resp.get("code") in MISSING:
                kind, resp = rec.op(name, "create_queue", {"name": name, "attributes": attrs},
                                    lambda n=name, a=attrs: c.create_queue(QueueName=n,
                                                                           Attributes=a))
            if kind == "ok":
                rec.urls[name] = url = resp["url"]
                kind, resp = rec.op(name, "queue_attributes", {"names": ["VisibilityTimeout"]},
                                    lambda u=url: c.get_queue_attributes(
                                        QueueUrl=u, AttributeNames=["VisibilityTimeout"]))
                if kind == "ok":
                    timeouts[name] = int(resp["attributes"]["VisibilityTimeout"])
                    continue
            if stop.is_set() or time.monotonic() >= deadline:
                return None
            stop.wait(0.5)
    return timeouts


def drain(rec: Recorder, timeouts: dict[str, int], stop: threading.Event,
          deadline: float) -> bool:
    """Receive and delete until every queue stayed empty (and answered) for a quiet window
    longer than the visibility timeout, so messages hidden by earlier receives came back."""
    queues = list(timeouts)
    quiet_s = max(timeouts.values()) + 4
    start = time.monotonic()
    last_busy = dict.fromkeys(queues, start)
    empties = dict.fromkeys(queues, 0)
    while not stop.is_set() and time.monotonic() < deadline:
        for q in queues:
            kind, resp = rec.receive(q, 10, WAIT_S)
            got = held_from(q, resp)
            if kind == "ok" and not got:
                empties[q] += 1
                continue
            last_busy[q], empties[q] = time.monotonic(), 0
            if got:
                rec.delete(got)
            if rec.unreachable:
                stop.wait(0.2)
        now = time.monotonic()
        if all(now - last_busy[q] >= quiet_s and empties[q] >= 3 for q in queues):
            return True
    return False


def _span(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    span = (int(low), int(high or low))
    if not 64 <= span[0] <= span[1] <= BATCH_MAX_BYTES:
        raise argparse.ArgumentTypeError(f"not 64 <= MIN <= MAX <= {BATCH_MAX_BYTES}: {text}")
    return span


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--history", required=True)
    p.add_argument("--seconds", type=float, default=10.0,
                   help="load duration; with --drain, the drain's overall bound")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-ops", type=int, default=0,
                   help="each client goes on past --seconds until it has made this many ops")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--standard-queue", required=True)
    p.add_argument("--fifo-queue", required=True)
    p.add_argument("--fifo-groups", type=int, default=4)
    p.add_argument("--visibility-timeout-s", type=int, default=3)
    p.add_argument("--body-bytes", type=_span, default=None, metavar="MIN:MAX",
                   help="body sizes in bytes (default: short bodies)")
    p.add_argument("--drain", action="store_true")
    p.add_argument("--run-tag", default=None, help="body prefix (default: seed and time)")
    args = p.parse_args(argv)
    if not args.fifo_queue.endswith(".fifo"):
        p.error("--fifo-queue must end in .fifo")
    if args.run_tag is None:
        args.run_tag = f"s{args.seed}t{time.time_ns():x}"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    history = History(args.history)
    deadline = time.monotonic() + args.seconds
    phase = "drain" if args.drain else "load"
    urls: dict[str, str] = {}
    setup = Recorder("drain" if args.drain else "setup", phase, history,
                     make_client(args.endpoint), urls)
    try:
        timeouts = ensure_queues(setup, args, stop, deadline)
        if timeouts is None:
            print("driver: queues could not be created before the deadline", file=sys.stderr)
            return 2
        if args.drain:
            complete = drain(setup, timeouts, stop, deadline)
            history.write({"type": "note", "note": "drain", "complete": complete,
                           "process": "drain", "phase": "drain"})
            return 0 if complete else 1
        seqs: dict[int, int] = {}
        seq_lock = threading.Lock()
        threads = []
        for i in range(args.clients):
            rec = Recorder(f"c{i}", phase, history, make_client(args.endpoint), urls)
            w = Worker(i, args, rec, stop, deadline, seqs, seq_lock)
            threads.append(threading.Thread(target=w.run, name=f"c{i}", daemon=True))
        for t in threads:
            t.start()
        # join in short steps so SIGTERM is handled; an op takes at most ~7 s
        hard_stop = deadline + 20 + args.min_ops  # and time for the ops --min-ops still asks
        while any(t.is_alive() for t in threads) and time.monotonic() < hard_stop:
            for t in threads:
                t.join(0.2)
            if stop.is_set():
                hard_stop = min(hard_stop, time.monotonic() + 10)
        return 0
    finally:
        history.close()


if __name__ == "__main__":
    sys.exit(main())
