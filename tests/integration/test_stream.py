"""The multiplexed stream (``Queues.Stream``): many SDK calls over one gRPC stream, each
answered to its own caller, failing and falling back the way unary calls do."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest

from serverproc import ServerProcess, free_port
from sqsq.client import AsyncClient, Client, _frames, _ops, _stream, _stubs
from sqsq.client._call import map_rpc_error
from sqsq.control.keys import LeaderHint, NodeRecord, ShardRecord
from sqsq.control.partition_map import MapSnapshot
from sqsq.errors import (
    InvalidParameterValue,
    QueueDoesNotExist,
    QueueError,
    ServiceUnavailable,
)
from sqsq.gateway.auth import ERROR_CODE_KEY
from sqsq.gateway.routing import ShardCaller
from sqsq.v1 import queues_pb2 as pb

from .conftest import KEY, SECRET, unique_name


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()  # noqa: S324 - SQS's own checksum


def send(queue: str, body: str, **fields: int) -> pb.SendMessageRequest:
    return pb.SendMessageRequest(queue_url=queue, message_body=body, **fields)


def receive(queue: str, wait_s: int) -> pb.ReceiveMessageRequest:
    return pb.ReceiveMessageRequest(queue_url=queue, wait_time_seconds=wait_s,
                                    max_number_of_messages=10)


def aio_stub(endpoint: str, creds: tuple[str, str] | None = None,
             ) -> tuple[grpc.aio.Channel, _stubs.AsyncStreamStub]:
    channel = grpc.aio.insecure_channel(endpoint)
    return channel, _stubs.AsyncStreamStub(channel, creds)


async def new_queue(stub: _stubs.AsyncStreamStub) -> str:
    reply = await stub.CreateQueue(pb.CreateQueueRequest(queue_name=unique_name("stream")))
    return reply.queue_url


@pytest.fixture
def streaming(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients made in the test use the stream and its frames, whatever the environment."""
    monkeypatch.setenv(_stream.ENV_STREAM, "1")
    monkeypatch.setenv(_frames.ENV_FRAMES, "1")


def test_the_stream_carries_every_unary_call_with_its_own_types() -> None:
    service = pb.DESCRIPTOR.services_by_name["Queues"]
    unary = [m for m in service.methods if m.name != "Stream"]
    assert sorted(_stream.FIELDS) == sorted(m.name for m in unary)
    for method in unary:
        field = _stream.FIELDS[method.name]
        assert pb.StreamRequest.DESCRIPTOR.fields_by_name[field].message_type is \
            method.input_type
        assert pb.StreamReply.DESCRIPTOR.fields_by_name[field].message_type is \
            method.output_type


def test_concurrent_calls_on_one_stream_each_get_their_own_reply(server: ServerProcess) -> None:
    async def main() -> None:
        channel, stub = aio_stub(server.endpoint)
        queue = await new_queue(stub)
        bodies = [f"message {i} " + "x" * i for i in range(40)]
        replies = await asyncio.gather(*(stub.SendMessage(send(queue, b)) for b in bodies))
        assert [r.md5_of_message_body for r in replies] == [md5(b) for b in bodies]
        assert len({r.message_id for r in replies}) == len(bodies)
        assert (stub.streams_opened, stub.unary_only, stub.in_flight) == (1, False, 0)
        await channel.close()

    asyncio.run(main())


def test_blocking_callers_on_many_threads_share_one_stream(server: ServerProcess) -> None:
    channel = grpc.insecure_channel(server.endpoint)
    stub = _stubs.StreamStub(channel)
    try:
        queue = stub.CreateQueue(pb.CreateQueueRequest(queue_name=unique_name("stream")),
                                 timeout=30).queue_url
        bodies = [f"thread message {i}" for i in range(64)]
        with futures.ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(lambda b: stub.SendMessage(send(queue, b), timeout=30),
                                    bodies))
        assert [r.md5_of_message_body for r in replies] == [md5(b) for b in bodies]
        assert (stub.streams_opened, stub.unary_only, stub.in_flight) == (1, False, 0)
    finally:
        channel.close()


def test_calls_larger_together_than_a_grpc_message_all_get_through(server: ServerProcess,
                                                                   ) -> None:
    """Calls ready at once share a frame (one gRPC message, at most 4 MiB): eight sends of
    700 kB, and then two receives of 2.8 MB each, need two frames each way."""

    async def main() -> None:
        channel, stub = aio_stub(server.endpoint)
        queue = await new_queue(stub)
        bodies = [f"{i}" * 700_000 for i in range(8)]
        sent = await asyncio.gather(*(stub.SendMessage(send(queue, b)) for b in bodies))
        assert [s.md5_of_message_body for s in sent] == [md5(b) for b in bodies]
        got: list[str] = []
        while len(got) < len(bodies):
            replies = await asyncio.gather(*(stub.ReceiveMessage(pb.ReceiveMessageRequest(
                queue_url=queue, max_number_of_messages=4, wait_time_seconds=1))
                for _ in range(2)))
            got += [m.body for r in replies for m in r.messages]
        assert sorted(got) == bodies
        assert stub.streams_opened == 1
        await channel.close()

    asyncio.run(main())


def test_a_failed_call_fails_only_its_caller_with_its_sqs_code(server: ServerProcess) -> None:
    async def main() -> None:
        channel, stub = aio_stub(server.endpoint)
        queue = await new_queue(stub)
        calls = [stub.SendMessage(send(queue, f"fine {i}")) for i in range(8)]
        calls.append(stub.SendMessage(send(queue + "-missing", "lost")))
        calls.append(stub.SendMessage(send(queue, "too late", delay_seconds=100_000)))
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert [r.md5_of_message_body for r in results[:8]] == [md5(f"fine {i}")
                                                               for i in range(8)]
        missing, invalid = results[8], results[9]
        assert isinstance(missing, grpc.RpcError) and isinstance(invalid, grpc.RpcError)
        assert missing.code() == grpc.StatusCode.NOT_FOUND
        assert isinstance(map_rpc_error(missing), QueueDoesNotExist)
        assert isinstance(map_rpc_error(invalid), InvalidParameterValue)
        assert "DelaySeconds" in invalid.details()
        # The stream outlived both failures.
        assert (await stub.SendMessage(send(queue, "after"))).md5_of_message_body == \
            md5("after")
        assert stub.streams_opened == 1
        await channel.close()

    asyncio.run(main())


def test_a_long_poll_does_not_hold_up_other_calls_on_the_stream(server: ServerProcess) -> None:
    async def main() -> None:
        channel, stub = aio_stub(server.endpoint)
        empty, other = await new_queue(stub), await new_queue(stub)
        poll = asyncio.create_task(stub.ReceiveMessage(receive(empty, 10), timeout=30))
        await stub.SendMessage(send(other, "while the poll waits"))
        got = await stub.ReceiveMessage(receive(other, 0))
        assert [m.body for m in got.messages] == ["while the poll waits"]
        assert not poll.done()
        await stub.SendMessage(send(empty, "wake up"))
        assert [m.body for m in (await poll).messages] == ["wake up"]
        assert stub.streams_opened == 1
        await channel.close()

    asyncio.run(main())


def test_a_call_past_its_deadline_is_abandoned_on_the_server_too(server: ServerProcess) -> None:
    """A long poll whose caller gave up must not take the next message."""

    async def main() -> None:
        channel, stub = aio_stub(server.endpoint)
        queue = await new_queue(stub)
        with pytest.raises(grpc.RpcError) as err:
            await stub.ReceiveMessage(receive(queue, 10), timeout=0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert isinstance(map_rpc_error(err.value), ServiceUnavailable)
        await stub.SendMessage(send(queue, "for the next caller"))
        got = await stub.ReceiveMessage(receive(queue, 5))
        assert [m.body for m in got.messages] == ["for the next caller"]
        await channel.close()

    asyncio.run(main())


def test_a_broken_stream_fails_calls_in_flight_and_the_next_call_reconnects(
        fresh_server: ServerProcess, streaming: None) -> None:
    async def main() -> None:
        client = AsyncClient(fresh_server.endpoint, timeout=30)
        name = unique_name("broken")
        queue = await client.create_queue(name)
        stub = client._stub()
        assert isinstance(stub, _stubs.AsyncStreamStub)
        poll = asyncio.create_task(client.receive_message(queue, wait_time_seconds=20))
        while stub.in_flight == 0:
            await asyncio.sleep(0)
        # Answered after the poll on the same stream: the server holds the poll now.
        await client.get_queue_url(name)
        fresh_server.kill9()
        with pytest.raises(ServiceUnavailable):
            await poll
        fresh_server.start()
        await client.send_message(queue, "after the restart")
        messages = await client.receive_message(queue, wait_time_seconds=5)
        assert [m.body for m in messages] == ["after the restart"]
        assert stub.streams_opened >= 2 and not stub.unary_only
        await client.close()

    asyncio.run(main())


# ---- a server that has only the unary methods --------------------------------------------


def _fake_send(request: pb.SendMessageRequest, context: grpc.ServicerContext,
               ) -> pb.SendMessageResponse:
    return pb.SendMessageResponse(message_id=f"id-{request.message_body}",
                                  md5_of_message_body=md5(request.message_body))


def _fake_get_queue_url(request: pb.GetQueueUrlRequest, context: grpc.ServicerContext,
                        ) -> pb.GetQueueUrlResponse:
    context.abort_with_status(_Status(grpc.StatusCode.NOT_FOUND, "no such queue",
                                      ((ERROR_CODE_KEY, "QueueDoesNotExist"),)))
    raise AssertionError("abort raises")


class _Status(grpc.Status):
    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple) -> None:
        self.code, self.details, self.trailing_metadata = code, details, trailing


@contextlib.contextmanager
def fake_server(handlers: dict[str, grpc.RpcMethodHandler]) -> Iterator[str]:
    """An in-process gRPC server offering only ``handlers`` of ``Queues``; its address."""
    port = free_port()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("sqsq.v1.Queues", handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@pytest.fixture
def unary_only_server() -> Iterator[str]:
    """An in-process gRPC server offering SendMessage and GetQueueUrl, and no Stream."""
    with fake_server({
        "SendMessage": grpc.unary_unary_rpc_method_handler(
            _fake_send, request_deserializer=pb.SendMessageRequest.FromString,
            response_serializer=pb.SendMessageResponse.SerializeToString),
        "GetQueueUrl": grpc.unary_unary_rpc_method_handler(
            _fake_get_queue_url, request_deserializer=pb.GetQueueUrlRequest.FromString,
            response_serializer=pb.GetQueueUrlResponse.SerializeToString),
    }) as endpoint:
        yield endpoint


def test_a_server_without_the_stream_gets_unary_calls(unary_only_server: str,
                                                      streaming: None) -> None:
    with Client(unary_only_server, timeout=10, batching=False) as client:
        assert client.send_message("q", "one").message_id == "id-one"
        assert client.send_message("q", "two").message_id == "id-two"
        with pytest.raises(QueueDoesNotExist):
            client.get_queue_url("nowhere")
        stub = client._stub()
        assert isinstance(stub, _stubs.StreamStub) and stub.unary_only

    async def main() -> None:
        client = AsyncClient(unary_only_server, timeout=10, batching=False)
        sent = await asyncio.gather(*(client.send_message("q", f"m{i}") for i in range(5)))
        assert [s.message_id for s in sent] == [f"id-m{i}" for i in range(5)]
        with pytest.raises(QueueDoesNotExist):
            await client.get_queue_url("nowhere")
        assert client._stub().unary_only
        await client.close()

    asyncio.run(main())


def _stream_without_early_headers(frames: Iterator[pb.StreamRequestFrame],
                                  context: grpc.ServicerContext) -> Iterator[pb.StreamReplyFrame]:
    """An older server's stream: its headers leave with its first reply, not before."""
    for frame in frames:
        out = pb.StreamReplyFrame()
        for call in frame.calls:
            out.replies.add(id=call.id).send_message.CopyFrom(
                _fake_send(call.send_message, context))
        yield out


def test_a_server_that_sends_no_headers_before_its_first_reply_still_gets_the_calls() -> None:
    async def main(endpoint: str) -> None:
        channel, stub = aio_stub(endpoint)
        try:
            sent = await asyncio.gather(*(stub.SendMessage(send("q", f"m{i}"), timeout=10)
                                          for i in range(3)))
            assert [s.message_id for s in sent] == ["id-m0", "id-m1", "id-m2"]
            assert (await stub.SendMessage(send("q", "later"), timeout=10)).message_id == \
                "id-later"
            assert stub.streams_opened == 1 and not stub.unary_only
        finally:
            await channel.close()

    with fake_server({"Stream": grpc.stream_stream_rpc_method_handler(
            _stream_without_early_headers,
            request_deserializer=pb.StreamRequestFrame.FromString,
            response_serializer=pb.StreamReplyFrame.SerializeToString)}) as endpoint:
        asyncio.run(main(endpoint))


class _StreamEndedAtFirst:
    """A Stream handler whose first stream ends CANCELLED: before its headers (as gRPC ends
    a stream that reaches a server as it stops, before any handler ran: no call on it can
    have run), or after it read a frame (``after_a_frame``: its calls may have run). Later
    streams answer every call with an empty reply of its kind (a receive: no messages)."""

    def __init__(self, after_a_frame: bool, held_s: float = 0.0) -> None:
        self.after_a_frame = after_a_frame
        self.held_s = held_s  # the first stream ends this long after it read a frame
        self.streams = 0
        self.calls_read: list[str | None] = []
        self.waits: list[int] = []  # each receive's WaitTimeSeconds, as the server got it

    def __call__(self, frames: Iterator[pb.StreamRequestFrame],
                 context: grpc.ServicerContext) -> Iterator[pb.StreamReplyFrame]:
        self.streams += 1
        if self.streams == 1 and not self.after_a_frame:
            context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")
        context.send_initial_metadata(())
        for frame in frames:
            self.calls_read += [call.WhichOneof("call") for call in frame.calls]
            self.waits += [call.receive_message.wait_time_seconds for call in frame.calls
                           if call.HasField("receive_message")]
            if self.streams == 1:
                time.sleep(self.held_s)  # a long poll waiting at a leader, then killed
                context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")
            out = pb.StreamReplyFrame()
            for call in frame.calls:
                getattr(out.replies.add(id=call.id), call.WhichOneof("call")).SetInParent()
            yield out



def _call_once(handler: _StreamEndedAtFirst, blocking: bool, method: str, *args: Any,
               **kwargs: Any) -> Any:
    async def main(endpoint: str) -> Any:
        # (not direct: the call is the only one made)
        client = AsyncClient(endpoint, timeout=10, batching=False, direct=False)
        try:
            return await getattr(client, method)(*args, **kwargs)
        finally:
            await client.close()

    with fake_server({"Stream": grpc.stream_stream_rpc_method_handler(
            handler, request_deserializer=pb.StreamRequestFrame.FromString,
            response_serializer=pb.StreamReplyFrame.SerializeToString)}) as endpoint:
        if not blocking:
            return asyncio.run(main(endpoint))
        with Client(endpoint, timeout=10, batching=False, direct=False) as client:
            return getattr(client, method)(*args, **kwargs)


@pytest.mark.parametrize("blocking", [False, True], ids=["asyncio", "blocking"])
def test_a_call_on_a_stream_that_ended_before_it_was_sent_is_made_again(
        streaming: None, blocking: bool) -> None:
    # A visibility change is not safe to repeat once sent; unsent (the stream ended before
    # the server accepted it: what a node stopping in a rolling restart does to a gateway's
    # new stream) it is made again, and the caller sees its answer, not the stream's end.
    handler = _StreamEndedAtFirst(after_a_frame=False)
    assert _call_once(handler, blocking, "change_message_visibility", "q", "handle", 5) is None
    assert handler.streams == 2 and handler.calls_read == ["change_message_visibility"]


@pytest.mark.parametrize("blocking", [False, True], ids=["asyncio", "blocking"])
def test_a_call_on_a_stream_that_ended_after_it_was_sent_is_not_made_again(
        streaming: None, blocking: bool) -> None:
    # Made again from a later moment, a visibility change would hide the message longer than
    # asked, or answer "expired" for a change that was made.
    handler = _StreamEndedAtFirst(after_a_frame=True)
    with pytest.raises(ServiceUnavailable, match="ended before the reply"):
        _call_once(handler, blocking, "change_message_visibility", "q", "handle", 5)
    assert handler.streams == 1 and handler.calls_read == ["change_message_visibility"]


@pytest.mark.parametrize("blocking", [False, True], ids=["asyncio", "blocking"])
@pytest.mark.parametrize("method, args, kwargs", [
    ("delete_message", ("q", "handle"), {}),
    ("receive_message", ("q",), {"wait_time_seconds": 0}),
], ids=["delete", "receive"])
def test_a_delete_or_receive_on_a_stream_that_ended_after_it_was_sent_is_made_again(
        streaming: None, blocking: bool, method: str, args: tuple, kwargs: dict) -> None:
    # Its outcome is unknown, as when a shard's leader changes under it. Deleting again is
    # safe (a message already gone deletes again successfully, a superseded handle is
    # refused either way); receiving again too (what a lost receive took stays hidden for its
    # visibility timeout whether or not the caller is told). The caller gets the answer, not
    # ServiceUnavailable.
    handler = _StreamEndedAtFirst(after_a_frame=True)
    assert _call_once(handler, blocking, method, *args, **kwargs) in (None, [])
    assert handler.streams == 2 and handler.calls_read == [method] * 2


@pytest.mark.parametrize("blocking", [False, True], ids=["asyncio", "blocking"])
def test_a_long_poll_made_again_waits_only_what_is_left_of_its_wait(
        streaming: None, blocking: bool) -> None:
    # A 3 s long poll whose shard's leader goes away 1 s into it: made again, it asks for
    # the 2 s left, so that its caller waits about the 3 s it asked for, not 1 + 3.
    handler = _StreamEndedAtFirst(after_a_frame=True, held_s=1.0)
    assert _call_once(handler, blocking, "receive_message", "q", wait_time_seconds=3) == []
    assert handler.waits == [3, 2]


def test_the_gateways_long_poll_made_again_waits_only_what_is_left_of_its_wait(
        streaming: None) -> None:
    # The same at the gateway, which makes its callers' calls at the shards' leaders.
    handler = _StreamEndedAtFirst(after_a_frame=True, held_s=1.0)

    async def main(endpoint: str) -> Any:
        node = NodeRecord("n1", endpoint, "127.0.0.1:1")
        caller = ShardCaller(_FixedMap(MapSnapshot(  # type: ignore[arg-type]
            nodes={"n1": node}, members={"n1": node},
            shards={0: ShardRecord(0, ("n1",), 1)}, leaders={0: LeaderHint(0, "n1", 1)})))
        try:
            return await caller.call(0, _ops.receive_message("q", wait_time_seconds=3))
        finally:
            await caller.close()

    with fake_server({"Stream": grpc.stream_stream_rpc_method_handler(
            handler, request_deserializer=pb.StreamRequestFrame.FromString,
            response_serializer=pb.StreamReplyFrame.SerializeToString)}) as endpoint:
        assert asyncio.run(main(endpoint)) == []
    assert handler.waits == [3, 2]


@dataclass
class _FixedMap:
    snapshot: MapSnapshot

    async def wait_for(self, ready: Any, timeout_s: float = 1.0) -> MapSnapshot:
        await asyncio.sleep(timeout_s)  # the map never changes here
        raise TimeoutError


# ---- authentication -----------------------------------------------------------------------


def test_the_stream_is_signed_and_a_bad_signature_refused(locked: ServerProcess,
                                                          streaming: None) -> None:
    with Client(locked.endpoint, credentials=(KEY, SECRET), timeout=10) as client:
        queue = client.create_queue(unique_name("signed"))
        client.send_message(queue, "signed")
        assert [m.body for m in client.receive_message(queue, wait_time_seconds=1)] == \
            ["signed"]
        stub = client._stub()
        # The gRPC stream, then the frame connection its headers offered: both took the token.
        assert isinstance(stub._stream, _frames.SyncFrameStream)
        assert stub.streams_opened == 2 and not stub.unary_only

    for credentials, code in (((KEY, "wrong-secret"), "SignatureDoesNotMatch"),
                              (("AKIDNOBODY", SECRET), "InvalidClientTokenId")):
        with Client(locked.endpoint, credentials=credentials, timeout=10) as client, \
                pytest.raises(QueueError) as err:
            client.list_queues()
        assert err.value.code == code
        assert not client._stub().unary_only

    async def main() -> None:
        anonymous = AsyncClient(locked.endpoint, credentials=None, timeout=10)
        anonymous._creds = None  # not even from the environment
        with pytest.raises(QueueError) as err:
            await anonymous.list_queues()
        assert err.value.code == "MissingAuthenticationToken"
        await anonymous.close()
        signed = AsyncClient(locked.endpoint, credentials=(KEY, SECRET), timeout=10)
        assert await signed.list_queues() is not None
        assert signed._stub().streams_opened == 1
        await signed.close()

    asyncio.run(main())


def test_a_refused_stream_answers_every_call_with_the_refusal(locked: ServerProcess) -> None:
    """The node refuses the stream as it opens; a call written to it meanwhile must still get
    that refusal (403), never a broken stream's UNAVAILABLE, however the two cross."""
    async def main() -> list[str]:
        channel, stub = aio_stub(locked.endpoint)
        codes = []
        try:
            for _ in range(150):  # each call opens a new stream: the last one was refused
                calls = [stub.ListQueues(pb.ListQueuesRequest(), timeout=10) for _ in range(3)]
                for result in await asyncio.gather(*calls, return_exceptions=True):
                    assert isinstance(result, grpc.RpcError), result
                    codes.append(map_rpc_error(result).code)
        finally:
            await channel.close()
        assert stub.streams_opened == 150 and not stub.unary_only
        return codes

    assert set(asyncio.run(main())) == {"MissingAuthenticationToken"}
