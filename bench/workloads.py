"""The workloads: what producers and consumers do, how many of each, how big the messages are.

Modes: ``send`` (producers only), ``recv`` (consumers only, from a preloaded queue, until it
is drained or the time is up) and ``steady`` (producers and consumers at once). ``hold_depth``
turns a steady run into a depth test: the queue is preloaded with that many messages and the
producers only keep up with the consumers, so the number waiting stays near it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

KIB = 1024


@dataclass(frozen=True)
class Workload:
    name: str
    mode: str  # "send" | "recv" | "steady"
    batch: int = 10  # messages per send / receive / delete call
    size: int = 100  # message body bytes
    fifo_groups: int = 0  # 0: a standard queue; n: a FIFO queue with n message groups
    producers: int = 2  # processes
    consumers: int = 2  # processes
    inflight: int = 16  # concurrent requests per process
    hold_depth: int = 0  # depth tests: messages kept waiting
    title: str = ""

    @property
    def fifo(self) -> bool:
        return self.fifo_groups > 0

    @property
    def headline_op(self) -> str:
        """The operation whose messages/s is the workload's headline number."""
        return "send" if self.mode == "send" else "delete"


def catalogue(deep_depth: int = 1_000_000) -> list[Workload]:
    """Every workload of a full run, in the order they run (sends before receives: the send
    rate sizes the preloads)."""
    return [
        Workload("send-c1", "send", batch=1, producers=1, consumers=0, inflight=1,
                 title="unbatched send at concurrency 1 (latency)"),
        Workload("send-1x100B", "send", batch=1, consumers=0, title="send, unbatched"),
        Workload("send-10x100B", "send", batch=10, consumers=0, title="send, batches of 10"),
        Workload("recv-1x100B", "recv", batch=1, producers=0,
                 title="receive+delete, unbatched, preloaded queue"),
        Workload("recv-10x100B", "recv", batch=10, producers=0,
                 title="receive+delete, batches of 10, preloaded queue"),
        Workload("steady-1x100B", "steady", batch=1, title="send+receive+delete, unbatched"),
        Workload("steady-10x100B", "steady", batch=10, title="send+receive+delete, batches of 10"),
        Workload("fifo1-10x100B", "steady", batch=10, fifo_groups=1,
                 title="FIFO steady state, 1 message group"),
        Workload("fifo100-10x100B", "steady", batch=10, fifo_groups=100,
                 title="FIFO steady state, 100 message groups"),
        Workload("send-10x64KiB", "send", batch=10, size=64 * KIB, consumers=0,
                 title="send 64 KiB messages, batches of 10"),
        Workload("steady-10x64KiB", "steady", batch=10, size=64 * KIB,
                 title="steady state, 64 KiB messages, batches of 10"),
        Workload("depth-1k", "steady", batch=10, hold_depth=1_000,
                 title="steady state with 1,000 messages kept waiting"),
        Workload(f"depth-{_short(deep_depth)}", "steady", batch=10, hold_depth=deep_depth,
                 title=f"steady state with {deep_depth:,} messages kept waiting"),
    ]


def _short(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def select(workloads: list[Workload], names: str | None) -> list[Workload]:
    """The workloads named in a comma-separated list (all when ``names`` is empty)."""
    if not names:
        return workloads
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    by_name = {w.name: w for w in workloads}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise SystemExit(f"unknown workload(s) {unknown}; known: {sorted(by_name)}")
    return [by_name[n] for n in wanted]


def scaled(w: Workload, producers: int | None, consumers: int | None,
           inflight: int | None) -> Workload:
    """Override the process and in-flight counts (not for the concurrency-1 latency run)."""
    if w.name == "send-c1":
        return w
    return replace(
        w,
        producers=w.producers if producers is None or w.producers == 0 else producers,
        consumers=w.consumers if consumers is None or w.consumers == 0 else consumers,
        inflight=w.inflight if inflight is None else inflight,
    )
