"""Direct routing's bookkeeping without a cluster: the SDK's reading of receipt handles and
FIFO groups agrees with the server's, and a call splits over partitions as the gateway
splits it."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest

from fakeclock import ModuleClock
from sqsq.client import _direct, _ops, _routed, _routed_sync
from sqsq.client._stream import CallError
from sqsq.core.receipts import ReceiptHandle, encode_receipt_handle
from sqsq.core.receipts import shard_of_receipt_handle as core_shard_of
from sqsq.errors import QueueError, not_leader_message
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import (
    ReceiveSpread,
    SendSpread,
    group_partition,
    send_partition,
    shard_of_receipt_handle,
)


def _handle(shard: int) -> str:
    return encode_receipt_handle(b"s" * 32, ReceiptHandle(shard, 7, 9, 1, 1234, 99))


def test_the_sdk_reads_a_receipt_handles_shard_as_the_server_does() -> None:
    for shard in (0, 1, 17, 65535):
        handle = _handle(shard)
        assert shard_of_receipt_handle(handle) == core_shard_of(handle) == shard
    for garbage in ("", "x", "not a handle!", _handle(3)[:-2], "A" * 300):
        assert shard_of_receipt_handle(garbage) is None
        assert core_shard_of(garbage) is None


def test_the_gateway_and_the_sdk_hash_fifo_groups_alike() -> None:
    from sqsq.gateway import cluster

    assert cluster.group_partition is group_partition
    spread = {group_partition(f"g{i}", 4) for i in range(100)}
    assert spread == {0, 1, 2, 3}
    assert group_partition("orders-17", 4) == group_partition("orders-17", 4)


def _route(shards: tuple[int, ...], fifo: bool = False) -> _direct.QueueRoute:
    return _direct.QueueRoute("q", "us-east-1", fifo, shards, 1, expires=1e18)


def test_a_fifo_batch_splits_by_group_with_a_request_id_per_partition() -> None:
    route = _route((5, 6, 7), fifo=True)
    request = pb.SendMessageBatchRequest(queue_url="q", request_id="r", entries=[
        pb.SendMessageBatchEntry(id=str(i), message_body="b", message_group_id=f"g{i}")
        for i in range(12)])
    split = _direct.parts("SendMessageBatch", request, route, SendSpread(start=0))
    assert len(split) > 1
    seen = []
    for shard, part in split:
        p = route.shards.index(shard)
        assert part.request_id == f"r/{p}"
        for entry in part.entries:
            assert group_partition(entry.message_group_id, 3) == p
            seen.append(entry.id)
    assert sorted(seen) == sorted(str(i) for i in range(12))


def test_standard_sends_take_turns_and_handles_go_to_their_shard() -> None:
    route = _route((5, 6))
    send = pb.SendMessageRequest(queue_url="q", message_body="b")
    spread = SendSpread(calls=1, start=-1)  # a turn per call
    assert [_direct.parts("SendMessage", send, route, spread)[0][0] for _ in range(4)] == \
        [5, 6, 5, 6]
    delete = pb.DeleteMessageBatchRequest(queue_url="q", entries=[
        pb.DeleteMessageBatchEntry(id="a", receipt_handle=_handle(6)),
        pb.DeleteMessageBatchEntry(id="b", receipt_handle=_handle(5)),
        pb.DeleteMessageBatchEntry(id="c", receipt_handle="garbled")])  # to the first
    split = dict(_direct.parts("DeleteMessageBatch", delete, route, spread))
    assert {s: [e.id for e in p.entries] for s, p in split.items()} == {6: ["a"],
                                                                         5: ["b", "c"]}
    one = pb.DeleteMessageBatchRequest(queue_url="q", entries=[
        pb.DeleteMessageBatchEntry(id=str(i), receipt_handle=_handle(6)) for i in range(10)])
    assert _direct.parts("DeleteMessageBatch", one, route, spread) == [(6, one)]  # whole
    # a first handle cut short begins like the rest but names no shard: read one by one
    one.entries[0].receipt_handle = _handle(6)[:-1]
    split = dict(_direct.parts("DeleteMessageBatch", one, route, spread))
    assert {s: len(p.entries) for s, p in split.items()} == {5: 1, 6: 9}
    merged = _direct.merged("DeleteMessageBatch", [
        pb.BatchResponse(successful=["a"]), pb.BatchResponse(successful=["b"], failed=[
            pb.BatchResultErrorEntry(id="c", code="ReceiptHandleIsInvalid")])])
    assert list(merged.successful) == ["a", "b"] and merged.failed[0].id == "c"
    # the deletes took no turn of the sends (a FIFO queue's sends take none either)
    _direct.parts("SendMessage", pb.SendMessageRequest(queue_url="q", message_body="b",
                                                       message_group_id="g"),
                  _route((5, 6), fifo=True), spread)
    assert _direct.parts("SendMessage", send, route, spread)[0][0] == 5


def test_standard_sends_go_to_one_partition_a_burst_at_a_time() -> None:
    """Calls made close together share a partition (its shard commits them in one Raft
    entry); the next burst takes the next partition, and over many bursts each gets its share."""
    now = [0.0]
    spread = SendSpread(lambda: now[0], calls=3, window_s=1.0, start=0)
    route = _route((5, 6))
    send = pb.SendMessageRequest(queue_url="q", message_body="b")

    def shard() -> int:
        return _direct.parts("SendMessage", send, route, spread)[0][0]

    assert [shard() for _ in range(7)] == [6, 6, 6, 5, 5, 5, 6]  # a burst is 3 calls
    now[0] += 1.0  # the window ends before the burst's calls do: the next partition
    assert [shard(), shard()] == [5, 5]
    for _ in range(5):
        now[0] += 2.0  # a client that sends now and then takes turns call by call
        assert shard() == (6 if _ % 2 == 0 else 5)
    counts = {5: 0, 6: 0}
    for _ in range(600):
        counts[shard()] += 1
    assert abs(counts[5] - counts[6]) <= 3
    # clients start at random turns, so that those started together do not move in step
    assert len({SendSpread().turn() for _ in range(20)}) > 1


def test_standard_sends_go_where_the_route_says_the_gateways_own_go() -> None:
    """A route that names a home partition and a width of one sends every call there; a
    wider one takes the partitions from home on, a burst at a time; a route from a gateway
    that names none takes every partition in turn."""
    send = pb.SendMessageRequest(queue_url="q", message_body="b")
    spread = SendSpread(calls=1, start=-1)  # a turn per call

    def shards(route: _direct.QueueRoute, calls: int = 8) -> list[int]:
        return [_direct.parts("SendMessage", send, route, spread)[0][0] for _ in range(calls)]

    home = _direct.QueueRoute("q", "us-east-1", False, (5, 6, 7, 8), 1, 1e18, 2, 1)
    assert shards(home) == [7] * 8
    wider = dataclasses.replace(home, send_home=3, send_width=2)
    assert set(shards(wider)) == {8, 5}
    assert set(shards(dataclasses.replace(home, send_width=0))) == {5, 6, 7, 8}
    read = _direct.QueueRoute.read(pb.QueueRoute(
        queue_name="q", partitions=[pb.ShardRoute(shard=s) for s in (5, 6, 7, 8)],
        send_home=2, send_width=1), now=0.0)
    assert (read.send_home, read.send_width) == (2, 1)
    assert send_partition(9, 3, 2, 4) in (3, 0) and send_partition(9, 0, 0, 4) == 1


def _partitions(messages: dict[int, int], looked: list[int]) -> _routed.AsyncRouter:
    """An async router over a queue of four partitions (shards 0-3) whose shards hold
    ``messages`` (a count each), noting in ``looked`` each shard a receive called."""
    table = _direct.Table(lambda: 0.0, receives=ReceiveSpread(lambda: 0.0, start=0))
    router = _routed.AsyncRouter(table, None, None, None)  # type: ignore[arg-type]

    async def at(route, part, call, queue, region, timeout):  # noqa: ANN001, ANN202
        shard = part[0]
        looked.append(shard)
        if not messages.get(shard):
            return pb.ReceiveMessageResponse()
        messages[shard] -= 1
        return pb.ReceiveMessageResponse(messages=[pb.Message(message_id=f"m{shard}")])

    router._at = at  # type: ignore[method-assign]
    return router


def test_a_receive_looks_first_where_the_last_one_found_messages() -> None:
    """Sends arrive a burst at a time on one partition; the receives that follow look there
    first instead of at each partition in turn, and move on once it is empty."""
    messages: dict[int, int] = {2: 5, 3: 1}
    looked: list[int] = []
    router = _partitions(messages, looked)
    route = _route((0, 1, 2, 3))
    call = _ops.receive_message("q", wait_time_seconds=0)

    async def receives() -> list[str]:
        return [(await router._fan_out(route, call, "q", None, None)).messages[0].message_id
                for _ in range(6)]

    got = asyncio.run(receives())
    assert got == ["m2"] * 5 + ["m3"]
    # the first receive looked at each partition from the first; the next ones only where
    # it found messages, until that partition was empty
    assert looked == [0, 1, 2, 2, 2, 2, 2, 2, 3]


def test_once_a_window_one_receive_looks_first_at_the_next_partition() -> None:
    now = [0.0]
    spread = ReceiveSpread(lambda: now[0], window_s=1.0)
    first = spread.first("q")
    spread.found("q", first + 2)  # messages two partitions on: the next receives start there
    assert [spread.first("q") for _ in range(3)] == [first + 2] * 3
    now[0] += 1.0  # the window ends: one receive (a probe) starts at the next partition
    assert [spread.first("q") for _ in range(3)] == [first + 3, first + 2, first + 2]
    spread.found("q", first + 3)  # the probe found messages there: the next ones start there
    assert [spread.first("q") for _ in range(2)] == [first + 3] * 2
    now[0] += 0.5  # a window from the move, not from the last probe
    assert spread.first("q") == first + 3
    now[0] += 0.5
    assert [spread.first("q") for _ in range(2)] == [first + 4, first + 3]
    other = spread.first("other")
    spread.found("q", first + 7)
    assert spread.first("other") == other  # each queue has its own
    assert len({ReceiveSpread().first("q") for _ in range(20)}) > 1  # random starts


def test_a_route_expires_and_an_unreachable_node_is_skipped_for_a_while() -> None:
    now = [100.0]
    table = _direct.Table(lambda: now[0])
    reply = pb.QueueRoute(queue_name="q", region="us-east-1", version=3)
    reply.partitions.add(shard=1, nodes=["a:1", "b:2", "c:3"])
    table.learn("q", None, reply)
    assert table.route("q", None)
    table.answered(1, "b:2")
    assert table.targets(1) == ["b:2", "a:1", "c:3"]
    table.unreachable("b:2")
    assert table.targets(1) == ["a:1", "c:3"]
    now[0] += _direct.NODE_DOWN_S + 0.1
    assert table.targets(1) == ["b:2", "a:1", "c:3"]
    assert table.route("q", None) is None  # old: asked for again
    table.learn("q", None, reply)  # the node that answered last stays first
    assert table.targets(1)[0] == "b:2"
    table.unroutable("gone", None)
    assert table.route("gone", None) is False
    assert table.stats.refreshes == 2


def test_a_partitioned_standard_queues_route_is_asked_for_again_sooner() -> None:
    """Its send width follows the home leader's load; a FIFO queue's sends follow their
    groups and a queue of one partition has nothing to widen: those keep their route."""
    now = [100.0]
    table = _direct.Table(lambda: now[0])

    def learn(name: str, fifo: bool, partitions: int) -> None:
        reply = pb.QueueRoute(queue_name=name, region="us-east-1", version=1, fifo=fifo)
        for shard in range(partitions):
            reply.partitions.add(shard=shard, nodes=["a:1"])
        table.learn(name, None, reply)

    learn("std", False, 4)
    learn("fifo", True, 4)
    learn("one", False, 1)
    now[0] += _direct.SEND_WIDTH_TTL_S + 0.01
    assert table.route("std", None) is None  # old: asked for again
    assert table.route("fifo", None) and table.route("one", None)
    now[0] += _direct.ROUTE_TTL_S
    assert table.route("fifo", None) is None and table.route("one", None) is None


def test_direct_routing_can_be_turned_off(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv(_direct.ENV_DIRECT, raising=False)
    assert _direct.enabled(None)
    assert not _direct.enabled(False)
    monkeypatch.setenv(_direct.ENV_DIRECT, "0")
    assert not _direct.enabled(None)
    assert _direct.enabled(True)


# ---- what a failed attempt at a shard leads to (sqsq.client._routed._Hop) ---------------


def _hop(call_retry: bool = True) -> tuple[_routed._Hop, _direct.Table]:
    table = _direct.Table(lambda: 100.0)
    reply = pb.QueueRoute(queue_name="q", region="us-east-1")
    reply.partitions.add(shard=1, nodes=["a:1", "b:2", "c:3"])
    route = table.learn("q", None, reply)
    router = _routed._Router(table, None)
    call = _ops.send_message("q", "b") if call_retry else _ops.delete_message("q", "h")
    return _routed._Hop(router, route, 1, call, 30.0, ("q", None)), table


def _refused() -> CallError:
    return CallError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")


def test_a_node_out_of_reach_is_passed_over_then_the_gateway_takes_the_call() -> None:
    hop, table = _hop()
    assert hop.failed(_refused(), "q", None) == 0.0
    assert hop.nodes.current == "b:2" and table.is_down("a:1")
    hop.failed(_refused(), "q", None)
    with pytest.raises(_direct.Fallback):
        hop.failed(_refused(), "q", None)  # none left, and nothing ran anywhere


def test_a_call_whose_outcome_is_unknown_never_goes_to_the_gateway() -> None:
    hop, _ = _hop()
    lost = CallError(grpc.StatusCode.UNAVAILABLE, "the stream ended before the reply")
    hop.failed(lost, "q", None)  # a send: retried at the shard, by its request id
    assert hop.ran
    with pytest.raises(QueueError):  # not Fallback: through the gateway it could land twice
        for _ in range(3):  # every node refuses the connection in turn
            hop.failed(_refused(), "q", None)


def test_the_nodes_refusals_send_the_call_to_the_gateway() -> None:
    hop, table = _hop(call_retry=False)
    unknown = CallError(grpc.StatusCode.NOT_FOUND, "no such queue", "QueueDoesNotExist")
    with pytest.raises(_direct.Fallback):
        hop.failed(unknown, "q", None)
    assert table.route("q", None) is None  # asked for again next time
    hop, table = _hop(call_retry=False)
    with pytest.raises(_direct.Fallback):
        hop.failed(CallError(grpc.StatusCode.UNAUTHENTICATED, "no",
                             "InvalidClientTokenId"), "q", None)
    assert table.off  # this client's credentials are not the nodes': the gateway's path


def test_not_leader_is_followed_unless_it_names_a_node_out_of_reach() -> None:
    hop, table = _hop()
    not_leader = CallError(grpc.StatusCode.UNAVAILABLE, not_leader_message("c:3"), "NotLeader")
    assert hop.failed(not_leader, "q", None) == 0.0
    assert hop.nodes.current == "c:3"
    hop, table = _hop()
    table.unreachable("c:3")
    with pytest.raises(_direct.Fallback):
        hop.failed(not_leader, "q", None)


def test_a_client_keeps_a_bounded_number_of_routes() -> None:
    table = _direct.Table(lambda: 0.0)
    reply = pb.QueueRoute(queue_name="q", region="us-east-1")
    reply.partitions.add(shard=0, nodes=["a:1"])
    for i in range(_direct.MAX_ROUTES + 10):
        table.learn(f"q{i}", None, reply)
        table.unroutable(f"gone{i}", None)
    assert len(table.routes) <= _direct.MAX_ROUTES
    assert table.route(f"q{_direct.MAX_ROUTES + 9}", None)  # the newest are kept


def test_messages_a_losing_long_poll_took_are_released_at_once() -> None:
    """Two partitions' long polls answer with messages together: the caller gets one
    partition's, and the other's are made visible again at once (visibility timeout 0),
    not left in flight for nobody until their visibility timeout ends."""
    table = _direct.Table(lambda: 0.0, receives=ReceiveSpread(lambda: 0.0, start=0))
    router = _routed.AsyncRouter(table, None, None, None)  # type: ignore[arg-type]
    released: list[tuple[int, list[tuple[str, int]]]] = []

    async def at(route, part, call, queue, region, timeout):  # noqa: ANN001, ANN202
        shard, request = part
        if call.method == "ChangeMessageVisibilityBatch":
            released.append((shard, [(e.receipt_handle, e.visibility_timeout)
                                     for e in request.entries]))
            return pb.BatchResponse()
        if not request.wait_time_seconds:
            return pb.ReceiveMessageResponse()
        if shard not in (1, 2):
            await asyncio.Event().wait()  # an empty long poll: cancelled by the winner
        await asyncio.sleep(0)
        return pb.ReceiveMessageResponse(messages=[pb.Message(
            message_id=f"m{shard}", receipt_handle=f"handle-{shard}")])

    router._at = at  # type: ignore[method-assign]

    async def receive() -> list[str]:
        reply = await router._fan_out(_route((0, 1, 2, 3)), _ops.receive_message(
            "q", wait_time_seconds=5), "q", None, None)
        for _ in range(10):
            await asyncio.sleep(0)
        return [m.message_id for m in reply.messages]

    assert asyncio.run(receive()) == ["m1"]
    assert released == [(2, [("handle-2", 0)])]


@pytest.mark.parametrize("wait_s, long_polls", [(3, [2, 2]), (1, [])])
def test_a_long_poll_after_a_slow_look_at_each_partition_waits_only_what_is_left(
        monkeypatch: pytest.MonkeyPatch, wait_s: int, long_polls: list[int]) -> None:
    """The look at each partition before the long poll took a second (one partition's
    leader being elected): the long polls wait what is left of the caller's wait, so the
    caller waits about what it asked for; with nothing left there is no long poll."""
    clock = ModuleClock()
    monkeypatch.setattr(_routed, "time", clock)
    table = _direct.Table(lambda: 0.0, receives=ReceiveSpread(lambda: 0.0, start=0))
    router = _routed.AsyncRouter(table, None, None, None)  # type: ignore[arg-type]
    waits: list[int] = []

    async def at(route, part, call, queue, region, timeout):  # noqa: ANN001, ANN202
        shard, request = part
        if not request.wait_time_seconds:
            if shard == 1:
                clock.advance(1.0)  # a call that finds the new leader a second later
            return pb.ReceiveMessageResponse()
        waits.append(request.wait_time_seconds)
        return pb.ReceiveMessageResponse()

    router._at = at  # type: ignore[method-assign]
    reply = asyncio.run(router._fan_out(_route((0, 1)), _ops.receive_message(
        "q", wait_time_seconds=wait_s), "q", None, None))
    assert not reply.messages
    assert waits == long_polls


@pytest.mark.parametrize("wait_s, gateway_wait", [(3, 2), (1, None)])
def test_the_blocking_clients_long_poll_after_a_slow_look_at_each_partition_waits_what_is_left(
        monkeypatch: pytest.MonkeyPatch, wait_s: int, gateway_wait: int | None) -> None:
    """As above, for the blocking ``Client``, whose long poll at a partitioned queue goes
    through the gateway after the look: the gateway is asked for what the look left of the
    wait (nothing left: the empty answer at once, no gateway call)."""
    from sqsq.client import Client

    clock = ModuleClock()
    monkeypatch.setattr(_routed_sync, "time", clock)
    table = _direct.Table(lambda: 0.0, receives=ReceiveSpread(lambda: 0.0, start=0))
    router = _routed_sync.SyncRouter(table, None, None, None)  # type: ignore[arg-type]

    def at(route, part, call, queue, region, timeout):  # noqa: ANN001, ANN202
        shard, request = part
        assert not request.wait_time_seconds  # only the look at each partition goes direct
        if shard == 1:
            clock.advance(1.0)  # a call that finds the new leader a second later
        return pb.ReceiveMessageResponse()

    router._at = at  # type: ignore[method-assign]
    router._route = lambda queue, region: _route((0, 1))  # type: ignore[method-assign]
    client = Client("127.0.0.1:1", direct=True)
    try:
        client._router = router
        asked: list[int] = []

        def via_gateway(call):  # noqa: ANN001, ANN202
            asked.append(call.request.wait_time_seconds)
            return call.parse(pb.ReceiveMessageResponse())

        client._via_gateway = via_gateway  # type: ignore[method-assign]
        assert client.receive_message("q", wait_time_seconds=wait_s) == []
        assert asked == ([] if gateway_wait is None else [gateway_wait])
    finally:
        client.close()
