"""The simulated network: every packet gets a seeded delay, and may be dropped, duplicated or
delivered out of order; partitions cut links whole, one way, or around a bridge node; a
nemesis may hold chosen packets back, then deliver some of them much later and lose the rest."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class NetworkFaults:
    drop: float = 0.0  # chance a packet is lost
    duplicate: float = 0.0  # chance a packet arrives twice
    delay_ms: tuple[int, int] = (1, 4)
    slow: float = 0.0  # chance of a long delay (reordering past many later packets)
    slow_ms: tuple[int, int] = (50, 1500)


class SimNetwork:
    def __init__(self, rng: random.Random, schedule: Callable[[int, Callable, object], None],
                 faults: NetworkFaults) -> None:
        self.rng = rng
        self.schedule = schedule  # (delay_ms, deliver, packet)
        self.faults = faults
        self.cut: set[tuple[str, str]] = set()  # (from, to) links that carry nothing
        self.sent = 0
        self.dropped = 0
        # Packets held back (``hold``): each rule by name, and what it caught, in order.
        self._rules: dict[str, Callable[[str, str, object], bool]] = {}
        self.held: list[tuple[str, str, object, Callable[[object], None]]] = []

    def send(self, frm: str, to: str, packet: object, deliver: Callable[[object], None]
             ) -> None:
        self.sent += 1
        f = self.faults
        if (frm, to) in self.cut or self.rng.random() < f.drop:
            self.dropped += 1
            return
        if any(rule(frm, to, packet) for rule in self._rules.values()):
            self.held.append((frm, to, packet, deliver))
            return
        copies = 2 if self.rng.random() < f.duplicate else 1
        for _ in range(copies):
            if self.rng.random() < f.slow:
                delay = self.rng.randint(*f.slow_ms)
            else:
                delay = self.rng.randint(*f.delay_ms)
            self.schedule(delay, self._arrive(frm, to, deliver), packet)

    def _arrive(self, frm: str, to: str, deliver: Callable[[object], None]
                ) -> Callable[[object], None]:
        def arrive(packet: object) -> None:
            if (frm, to) in self.cut:  # cut while in flight
                self.dropped += 1
                return
            deliver(packet)
        return arrive

    # ---- partitions ----------------------------------------------------------------------

    def isolate(self, groups: list[set[str]]) -> None:
        """Whole partition: no link between nodes of different groups, either way."""
        for a in groups:
            for b in groups:
                if a is not b:
                    self.cut.update((x, y) for x in a for y in b)

    def one_way(self, frm: set[str], to: set[str]) -> None:
        self.cut.update((x, y) for x in frm for y in to)

    def bridge(self, left: set[str], middle: str, right: set[str]) -> None:
        """Left and right cannot talk; both still reach the middle node."""
        self.cut.update((x, y) for x in left for y in right)
        self.cut.update((y, x) for x in left for y in right)
        self.cut.difference_update({(middle, x) for x in left | right})
        self.cut.difference_update({(x, middle) for x in left | right})

    def heal(self, *, held: bool = True) -> None:
        """Every link carries again; packets still held are lost (``held=False``: the cuts
        only, what is held and the rules that hold it stay)."""
        self.cut.clear()
        if held:
            self._rules.clear()
            self.dropped += len(self.held)
            self.held.clear()

    # ---- packets held back -----------------------------------------------------------------

    def hold(self, name: str, rule: Callable[[str, str, object], bool]) -> None:
        """From now on, packets ``rule(frm, to, packet)`` picks are held, not delivered
        (until ``release`` or ``heal``): as a packet stuck in a queue for seconds is."""
        self._rules[name] = rule

    def stop_holding(self, name: str) -> None:
        self._rules.pop(name, None)

    def release(self, pick: Callable[[str, str, object], bool]) -> int:
        """Deliver the held packets ``pick`` chooses (asked once each), in the order they were
        sent, each a moment from now, through the cuts in force then; the rest stay held.
        How many."""
        out, kept = self._split(pick)
        self.held = kept
        for i, (frm, to, packet, deliver) in enumerate(out):
            self.schedule(1 + i, self._arrive(frm, to, deliver), packet)
        return len(out)

    def lose(self, pick: Callable[[str, str, object], bool]) -> int:
        """Drop the held packets ``pick`` chooses. How many."""
        out, self.held = self._split(pick)
        self.dropped += len(out)
        return len(out)

    def _split(self, pick: Callable[[str, str, object], bool]) -> tuple[list, list]:
        out: list = []
        kept: list = []
        for h in self.held:
            (out if pick(h[0], h[1], h[2]) else kept).append(h)
        return out, kept
