"""The simulated network's held packets: what a scripted nemesis keeps back and delivers
late (``SimNetwork.hold``)."""

from __future__ import annotations

import heapq
import random

from sqsq.sim.network import NetworkFaults, SimNetwork


class Clock:
    def __init__(self) -> None:
        self.queue: list = []
        self.seq = 0

    def schedule(self, delay: int, deliver, packet) -> None:  # noqa: ANN001
        self.seq += 1
        heapq.heappush(self.queue, (delay, self.seq, deliver, packet))

    def run(self) -> None:
        while self.queue:
            _, _, deliver, packet = heapq.heappop(self.queue)
            deliver(packet)


def _network() -> tuple[SimNetwork, Clock, list]:
    clock, got = Clock(), []
    return SimNetwork(random.Random(1), clock.schedule, NetworkFaults()), clock, got


def test_held_packets_arrive_only_when_released_and_in_the_order_sent() -> None:
    net, clock, got = _network()
    net.hold("late", lambda frm, to, p: frm == "f" and to == "a")
    for i in range(4):
        net.send("f", "a", i, got.append)
    net.send("b", "a", "other", got.append)
    clock.run()
    assert got == ["other"]
    assert net.release(lambda frm, to, p: p in (1, 3)) == 2
    clock.run()
    assert got == ["other", 1, 3]
    net.stop_holding("late")
    net.send("f", "a", 9, got.append)
    clock.run()
    assert got == ["other", 1, 3, 9]


def test_what_is_not_released_can_be_lost() -> None:
    net, clock, got = _network()
    net.hold("late", lambda frm, to, p: True)
    for i in range(3):
        net.send("f", "a", i, got.append)
    assert net.lose(lambda frm, to, p: p == 1) == 1
    assert net.release(lambda frm, to, p: True) == 2
    clock.run()
    assert got == [0, 2] and net.dropped == 1


def test_heal_loses_what_is_still_held() -> None:
    net, clock, got = _network()
    net.hold("late", lambda frm, to, p: True)
    net.send("f", "a", 1, got.append)
    net.heal()
    assert net.release(lambda frm, to, p: True) == 0
    net.send("f", "a", 2, got.append)
    clock.run()
    assert got == [2] and net.dropped == 1
