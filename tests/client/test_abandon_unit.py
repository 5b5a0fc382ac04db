"""Calls stuck at a node that stopped answering, abandoned when a newer leader is known
(``sqsq.client._abandon``), without a cluster: which attempts a newer leader makes stale,
how a blocking stream call ends, and where a client's next call goes. The real freeze is
tests/cluster/test_freeze.py."""

from __future__ import annotations

import threading

import grpc
import pytest

from sqsq.client import _direct, _ops, _routed
from sqsq.client._abandon import ABANDONED, Abandon, Waiting
from sqsq.client._stream import CallError
from sqsq.client._stream_sync import _SyncCalls
from sqsq.errors import QueueError
from sqsq.v1 import queues_pb2 as pb


def test_a_newer_leader_abandons_only_the_calls_it_makes_stale() -> None:
    waiting = Waiting(clock=lambda: 0.0)
    _, at_old = waiting.begin(1, "a:1", 4)
    _, at_new = waiting.begin(1, "b:2", 4)  # followed NotLeader there before the map knew
    _, same_term = waiting.begin(1, "c:3", 5)  # began once term 5 was known
    _, other_shard = waiting.begin(2, "a:1", 4)
    assert waiting.newer_leader(1, "b:2", 5) == 1
    assert at_old.fired and at_old.leader == "b:2"
    assert not (at_new.fired or same_term.fired or other_shard.fired)
    assert waiting.newer_leader(1, "b:2", 4) == 0  # an old hint abandons nothing


def test_the_slow_calls_are_told_by_their_keys_and_ended_ones_are_forgotten() -> None:
    now = [0.0]
    waiting = Waiting(clock=lambda: now[0])
    first, _ = waiting.begin(1, "a:1", 4, ("q", None))
    now[0] = 1.0
    waiting.begin(2, "a:1", 4, ("r", None))
    assert waiting.slow(0.5) == {1: {("q", None)}}
    waiting.end(1, first)
    assert waiting.slow(0.0) == {2: {("r", None)}}
    assert waiting


def test_an_abandon_fired_before_the_call_attached_ends_it_at_once() -> None:
    ended = []
    handle = Abandon()
    handle.fire("b:2")
    handle.fire("c:3")  # once only
    handle.attach(lambda: ended.append(1))
    assert ended == [1] and handle.leader == "b:2"


class _Calls(_SyncCalls):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list = []

    def _put(self, outgoing) -> None:  # noqa: ANN001
        self.sent.append(outgoing[0])


def test_a_blocking_stream_call_abandoned_ends_unavailable_and_is_cancelled() -> None:
    calls, handle, out = _Calls(), Abandon(), []

    def call() -> None:
        try:
            calls.call("receive_message",
                       pb.ReceiveMessageRequest(queue_url="q").SerializeToString(), 10, None,
                       handle)
        except CallError as exc:
            out.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    while not calls.pending:
        threading.Event().wait(0.01)
    handle.fire("b:2")
    thread.join(5)
    assert [(e.code(), e.details()) for e in out] == [(grpc.StatusCode.UNAVAILABLE, ABANDONED)]
    (last,) = pb.StreamRequestFrame.FromString(calls.sent[-1]).calls  # a frame's entry
    assert last.HasField("cancel") and calls.pending == {}


def test_a_route_naming_a_newer_leader_puts_it_first() -> None:
    table = _direct.Table(lambda: 0.0)
    reply = pb.QueueRoute(queue_name="q", region="us-east-1")
    reply.partitions.add(shard=1, nodes=["a:1", "b:2", "c:3"], leader="a:1", leader_term=4)
    table.learn("q", None, reply)
    table.answered(1, "c:3")  # followed NotLeader there
    table.learn("q", None, reply)
    assert table.targets(1)[0] == "c:3"  # the hint is not newer: the node that answered
    reply.partitions[0].leader, reply.partitions[0].leader_term = "b:2", 5
    table.learn("q", None, reply)
    assert table.targets(1)[0] == "b:2"


def test_an_abandoned_attempt_goes_on_at_the_new_leader_and_never_to_the_gateway() -> None:
    table = _direct.Table(lambda: 0.0)
    reply = pb.QueueRoute(queue_name="q", region="us-east-1")
    reply.partitions.add(shard=1, nodes=["a:1", "b:2", "c:3"], leader="a:1", leader_term=4)
    route = table.learn("q", None, reply)
    router = _routed._Router(table, None)
    hop = _routed._Hop(router, route, 1, _ops.receive_message("q", wait_time_seconds=20),
                       30.0, ("q", None))
    handle = Abandon()
    handle.fire("b:2")
    hop.abandoned(handle)
    assert hop.nodes.current == "b:2" and hop.ran
    table.unreachable("a:1")
    table.unreachable("c:3")
    with pytest.raises(QueueError):  # not Fallback: the first attempt may have run
        hop.failed(CallError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all"),
                   "q", None)


def test_a_client_asks_for_one_route_a_shard_however_many_of_its_queues_wait() -> None:
    now = [0.0]
    router = _routed._Router(_direct.Table(lambda: now[0]), None)
    router.waiting = Waiting(clock=lambda: now[0])
    for queue in ("q1", "q2", "q3"):
        router.waiting.begin(1, "a:1", 4, (queue, None))
    router.waiting.begin(2, "b:2", 4, ("r", None))
    assert router.slow_queues() == set()  # none has waited long yet
    now[0] = 1.0
    assert router.slow_queues() == {("q1", None), ("r", None)}
