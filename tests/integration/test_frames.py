"""The frame connection (``sqsq.gateway.frames``): the SDK's calls over plain TCP once the
gRPC stream's headers offer it, with the stream's checks, answers and fallbacks."""

from __future__ import annotations

import asyncio
import gc
import select
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import grpc._channel as grpc_channel
import grpc.aio
import pytest

from serverproc import ServerProcess, free_port
from sqsq.client import AsyncClient, Client, _frames, _stream, _stream_sync
from sqsq.errors import QueueError, ServiceUnavailable
from sqsq.gateway import frames
from sqsq.gateway.auth import Authenticator
from sqsq.gateway.frames import FrameServer
from sqsq.gateway.grpc_service import QueuesService
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import (
    FRAME_ID_KEY,
    FRAME_PORT_KEY,
    GRPC_METADATA_KEY,
    MAX_FRAME_BYTES,
    NOT_RUN,
    STREAM_METHOD,
    FrameError,
    FrameSplitter,
    framed,
    grpc_token,
)

from .conftest import KEY, SECRET, unique_name


@pytest.fixture(autouse=True)
def frames_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients made in these tests use the stream and its frames, whatever the environment."""
    monkeypatch.setenv(_stream.ENV_STREAM, "1")
    monkeypatch.setenv(_frames.ENV_FRAMES, "1")


def headers_of(endpoint: str) -> dict[str, str]:
    """The Stream call's headers, as the server sends them to a client it accepts."""
    token = ((GRPC_METADATA_KEY, grpc_token(KEY, SECRET, STREAM_METHOD)),)

    async def main() -> dict[str, str]:
        async with grpc.aio.insecure_channel(endpoint) as channel:
            call = channel.stream_stream(STREAM_METHOD)(metadata=token)
            headers = {k: str(v) for k, v in await call.initial_metadata()}
            call.cancel()
            return headers

    return asyncio.run(main())


def read_frame(sock: socket.socket) -> bytes | None:
    """One frame's message off ``sock``; None when the server closed the connection (a
    reset too: bytes sent after its close are answered so)."""
    try:
        header = sock.recv(4, socket.MSG_WAITALL)
    except ConnectionResetError:
        return None
    if len(header) < 4:
        return None
    (size,) = struct.unpack(">I", header)
    return sock.recv(size, socket.MSG_WAITALL)


def frame_socket(endpoint: str) -> tuple[socket.socket, str]:
    """A raw connection to ``endpoint``'s frame port, and the server id it must name."""
    headers = headers_of(endpoint)
    sock = socket.create_connection(("127.0.0.1", int(headers[FRAME_PORT_KEY])), timeout=10)
    return sock, headers[FRAME_ID_KEY]


def test_an_async_client_moves_to_the_frame_connection_and_each_caller_gets_its_reply(
        server: ServerProcess) -> None:
    async def main() -> None:
        client = AsyncClient(server.endpoint, timeout=30)
        queue = await client.create_queue(unique_name("frames"))
        bodies = [f"message {i} " + "x" * i for i in range(60)]
        sent = await asyncio.gather(*(client.send_message(queue, b) for b in bodies))
        stub = client._stub()
        assert isinstance(stub._stream, _frames.AioFrameStream)
        assert [s.md5_of_message_body for s in sent] == \
            [_md5(b) for b in bodies]
        got: list[str] = []
        while len(got) < len(bodies):
            messages = await client.receive_message(queue, max_number_of_messages=10,
                                                    wait_time_seconds=5)
            assert messages, f"{len(got)} of {len(bodies)} received"
            await asyncio.gather(*(client.delete_message(queue, m.receipt_handle)
                                   for m in messages))
            got += [m.body for m in messages]
        assert sorted(got) == sorted(bodies)
        with pytest.raises(QueueError) as err:  # an error is its own caller's, with its code
            await client.get_queue_url(unique_name("nobody-made-this"))
        assert err.value.code == "QueueDoesNotExist"
        assert isinstance(stub._stream, _frames.AioFrameStream) and not stub._stream.done
        await client.close()

    asyncio.run(main())


def test_a_blocking_client_moves_to_the_frame_connection_too(server: ServerProcess) -> None:
    with Client(server.endpoint, timeout=30) as client:
        queue = client.create_queue(unique_name("frames-sync"))
        client.send_message(queue, "first")  # the stream's headers have offered frames by now
        bodies = [f"thread {i}" for i in range(24)]
        with ThreadPoolExecutor(8) as pool:
            sent = list(pool.map(lambda b: client.send_message(queue, b), bodies))
        assert [s.md5_of_message_body for s in sent] == [_md5(b) for b in bodies]
        stub = client._stub()
        assert isinstance(stub._stream, _frames.SyncFrameStream)
        got: list[str] = []
        while len(got) < len(bodies) + 1:
            messages = client.receive_message(queue, max_number_of_messages=10,
                                              wait_time_seconds=5)
            assert messages, f"{len(got)} received"
            for m in messages:
                client.delete_message(queue, m.receipt_handle)
            got += [m.body for m in messages]
        assert sorted(got) == sorted(["first", *bodies])
        with pytest.raises(QueueError) as err:
            client.get_queue_url(unique_name("nobody-made-this"))
        assert err.value.code == "QueueDoesNotExist"
        assert stub.streams_opened == 2  # the gRPC stream, then the frame connection


def test_a_closed_blocking_client_leaves_no_thread_of_its_own(
        server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader thread still inside gRPC when the interpreter exits can be stopped holding a
    call's lock, and the process then hangs in that call's finalizer (a CLI that printed its
    answer and never exited): closing the client ends its readers first."""
    end = _stream_sync._SyncCalls._end

    def slow_end(self: _stream_sync._SyncCalls, error: Any) -> None:
        time.sleep(0.3)  # a reader slow to finish: the window the close must not leave open
        end(self, error)

    monkeypatch.setattr(_stream_sync._SyncCalls, "_end", slow_end)
    before = set(threading.enumerate())
    calls_before = {id(o) for o in gc.get_objects() if isinstance(o, grpc_channel._Rendezvous)}
    gc.disable()  # what is left must be freed by the close, not by a collection at exit
    try:
        for calls in (1, 2):  # as a CLI command does; then the frame connection too
            with Client(server.endpoint, timeout=30) as client:
                queue = client.create_queue(unique_name("frames-close"))
                if calls == 2:
                    client.send_message(queue, "on the frame connection")
        left = [t.name for t in set(threading.enumerate()) - before
                if t.name.startswith(("sqsq-stream", "sqsq-frames"))]
        assert left == []
        calls_left = [o for o in gc.get_objects()
                      if isinstance(o, grpc_channel._Rendezvous) and id(o) not in calls_before]
        assert calls_left == []
    finally:
        gc.enable()


def _md5(text: str) -> str:
    import hashlib

    return hashlib.md5(text.encode()).hexdigest()  # noqa: S324 - SQS's own checksum


def test_a_frame_connection_checks_credentials_as_the_stream_does(locked: ServerProcess,
                                                                  ) -> None:
    async def main() -> None:
        signed = AsyncClient(locked.endpoint, credentials=(KEY, SECRET), timeout=10)
        queue = await signed.create_queue(unique_name("signed"))
        await signed.send_message(queue, "signed")
        assert isinstance(signed._stub()._stream, _frames.AioFrameStream)
        assert [m.body for m in await signed.receive_message(queue, wait_time_seconds=1)] \
            == ["signed"]
        await signed.close()

    asyncio.run(main())
    sock, server_id = frame_socket(locked.endpoint)
    with sock:  # a hello without a token: refused with the stream's code, then closed
        sock.sendall(framed(pb.FrameHello(metadata={FRAME_ID_KEY: server_id})))
        refused = pb.StreamReplyFrame.FromString(read_frame(sock))
        assert refused.refused.code == "MissingAuthenticationToken"
        assert refused.refused.status == grpc.StatusCode.UNAUTHENTICATED.value[0]
        sock.sendall(framed(pb.StreamRequestFrame(calls=[
            pb.StreamRequest(id=1, list_queues=pb.ListQueuesRequest())])))
        assert read_frame(sock) is None  # nothing more: the call was not run


def test_a_hello_naming_another_server_is_refused_as_not_run(server: ServerProcess) -> None:
    sock, _ = frame_socket(server.endpoint)
    with sock:
        sock.sendall(framed(pb.FrameHello(metadata={FRAME_ID_KEY: "another-server"})))
        refused = pb.StreamReplyFrame.FromString(read_frame(sock)).refused
        assert refused.status == grpc.StatusCode.UNAVAILABLE.value[0]
        assert NOT_RUN in refused.message
        assert read_frame(sock) is None


@pytest.mark.parametrize("garbage", [
    struct.pack(">I", MAX_FRAME_BYTES + 1),  # a length past the limit
    struct.pack(">I", 3) + b"\xff\xff\xff",  # not a protobuf message after a good hello
], ids=["too-long", "not-protobuf"])
def test_bytes_that_are_not_frames_cut_the_connection_and_nothing_else(
        server: ServerProcess, garbage: bytes) -> None:
    sock, server_id = frame_socket(server.endpoint)
    with sock:
        sock.sendall(framed(pb.FrameHello(metadata={FRAME_ID_KEY: server_id})))
        assert pb.StreamReplyFrame.FromString(read_frame(sock)) == pb.StreamReplyFrame()
        sock.sendall(garbage)
        assert read_frame(sock) is None

    async def main() -> None:  # the server goes on serving
        client = AsyncClient(server.endpoint, timeout=10)
        queue = await client.create_queue(unique_name("after-garbage"))
        await client.send_message(queue, "still here")
        assert [m.body for m in await client.receive_message(queue, wait_time_seconds=1)] \
            == ["still here"]
        await client.close()

    asyncio.run(main())


def test_raw_frames_answer_each_call_by_id_and_end_after_the_half_close(
        server: ServerProcess) -> None:
    sock, server_id = frame_socket(server.endpoint)
    name = unique_name("raw")
    with sock:
        sock.sendall(framed(pb.FrameHello(metadata={FRAME_ID_KEY: server_id})))
        assert read_frame(sock) == b""  # accepted: an empty frame
        sock.sendall(framed(pb.StreamRequestFrame(calls=[
            pb.StreamRequest(id=7, create_queue=pb.CreateQueueRequest(queue_name=name)),
            pb.StreamRequest(id=8, get_queue_url=pb.GetQueueUrlRequest(
                queue_name=unique_name("missing"))),
        ])))
        sock.shutdown(socket.SHUT_WR)  # half-close: the server answers, then closes
        replies = {}
        while (message := read_frame(sock)) is not None:
            for reply in pb.StreamReplyFrame.FromString(message).replies:
                replies[reply.id] = reply
    assert set(replies) == {7, 8}
    assert replies[7].create_queue.queue_url.endswith("/" + name)
    assert replies[8].error.code == "QueueDoesNotExist"


def test_a_frame_port_out_of_reach_leaves_the_client_on_grpc(
        server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    closed = free_port()  # nothing listens here: connections are refused
    read = _frames.Offer.read

    def unreachable(target: str, headers: dict[str, str]) -> _frames.Offer | None:
        offer = read(target, headers)
        return offer and _frames.Offer(offer.host, closed, offer.server_id)

    monkeypatch.setattr(_frames.Offer, "read", staticmethod(unreachable))

    async def main() -> None:
        client = AsyncClient(server.endpoint, timeout=10)
        queue = await client.create_queue(unique_name("no-frames"))
        sent = await asyncio.gather(*(client.send_message(queue, str(i)) for i in range(20)))
        assert len({s.message_id for s in sent}) == 20
        stub = client._stub()
        assert isinstance(stub._stream, _stream._AioStream) and not stub.unary_only
        await client.send_message(queue, "later")  # and it does not try again
        assert stub.streams_opened == 2
        await client.close()

    asyncio.run(main())


def test_a_refused_frame_connection_is_tried_again_when_a_later_stream_offers_it(
        fresh_server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    read = _frames.Offer.read
    offers: list[str] = []

    def first_names_another_server(target: str, headers: dict[str, str]) -> _frames.Offer:
        offer = read(target, headers)
        assert offer is not None
        offers.append(offer.server_id)
        if len(offers) == 1:  # as if the port now belonged to another server: refused
            return _frames.Offer(offer.host, offer.port, "another-server")
        return offer

    monkeypatch.setattr(_frames.Offer, "read", staticmethod(first_names_another_server))

    async def main() -> None:
        client = AsyncClient(fresh_server.endpoint, timeout=30)
        queue = await client.create_queue(unique_name("refused-once"))
        await asyncio.gather(*(client.send_message(queue, str(i)) for i in range(5)))
        stub = client._stub()
        assert isinstance(stub._stream, _stream._AioStream)  # refused: on gRPC
        assert await asyncio.to_thread(fresh_server.stop) == 0  # that stream ends
        fresh_server.start()
        await client.send_message(queue, "after the restart")  # a new stream, a new offer
        await client.send_message(queue, "on frames")
        assert isinstance(stub._stream, _frames.AioFrameStream)
        assert len(offers) == 2
        await client.close()

    asyncio.run(main())


def test_frames_off_in_the_environment_keeps_the_client_on_grpc(
        server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_frames.ENV_FRAMES, "0")

    async def main() -> None:
        client = AsyncClient(server.endpoint, timeout=10)
        queue = await client.create_queue(unique_name("grpc-only"))
        await asyncio.gather(*(client.send_message(queue, str(i)) for i in range(5)))
        assert isinstance(client._stub()._stream, _stream._AioStream)
        assert client._stub().streams_opened == 1
        await client.close()

    asyncio.run(main())


def test_a_server_restart_fails_the_calls_in_flight_and_the_client_finds_the_new_port(
        fresh_server: ServerProcess) -> None:
    async def main() -> None:
        client = AsyncClient(fresh_server.endpoint, timeout=30)
        name = unique_name("restart")
        queue = await client.create_queue(name)
        await client.get_queue_url(name)
        stub = client._stub()
        assert isinstance(stub._stream, _frames.AioFrameStream)
        poll = asyncio.create_task(client.receive_message(queue, wait_time_seconds=20))
        while stub.in_flight == 0:
            await asyncio.sleep(0)
        fresh_server.kill9()
        with pytest.raises(ServiceUnavailable):
            await poll
        fresh_server.start()  # its frame port is another one now
        await client.send_message(queue, "after the restart")
        await client.send_message(queue, "and on frames again")
        assert isinstance(stub._stream, _frames.AioFrameStream)
        messages = await client.receive_message(queue, max_number_of_messages=10,
                                                wait_time_seconds=5)
        assert sorted(m.body for m in messages) == ["after the restart", "and on frames again"]
        await client.close()

    asyncio.run(main())


def test_a_clean_shutdown_drains_the_frame_connection(fresh_server: ServerProcess) -> None:
    """A server stopping answers what it was sent; the client half-closes, opens anew."""
    async def main() -> None:
        client = AsyncClient(fresh_server.endpoint, timeout=30)
        queue = await client.create_queue(unique_name("drain"))
        await client.send_message(queue, "before")
        stub = client._stub()
        first = stub._stream
        assert isinstance(first, _frames.AioFrameStream)
        assert await asyncio.to_thread(fresh_server.stop) == 0
        await asyncio.wait_for(first.closed, 10)  # ended by the server once drained
        fresh_server.start()
        await client.send_message(queue, "after")
        messages = await client.receive_message(queue, max_number_of_messages=10,
                                                wait_time_seconds=5)
        assert sorted(m.body for m in messages) == ["after", "before"]
        await client.close()

    asyncio.run(main())


def test_the_splitter_rebuilds_frames_cut_anywhere_and_refuses_oversized_ones() -> None:
    messages = [pb.FrameHello(metadata={"k": "v" * n}) for n in (0, 1, 300)]
    wire = b"".join(framed(m) for m in messages)
    for cut in range(1, 12):
        splitter = FrameSplitter()
        out: list[bytes] = []
        for i in range(0, len(wire), cut):
            out += splitter.feed(wire[i:i + cut])
        assert [pb.FrameHello.FromString(b) for b in out] == messages
    with pytest.raises(FrameError):
        FrameSplitter().feed(struct.pack(">I", MAX_FRAME_BYTES + 1))


def test_a_frame_connection_that_never_says_hello_is_cut_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that sends no hello is closed after ``HELLO_TIMEOUT_S``; one that said
    hello stays open. (A frame server in this process, so the deadline can be short.)"""
    monkeypatch.setattr(frames, "HELLO_TIMEOUT_S", 0.3)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> FrameServer:
        server = FrameServer(QueuesService(api=object()), Authenticator({}))
        await server.start("127.0.0.1")
        return server

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as polite:
            polite.sendall(framed(pb.FrameHello(metadata={FRAME_ID_KEY: server.server_id})))
            assert read_frame(polite) == b""  # accepted
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as silent:
                assert read_frame(silent) is None  # closed by the server
            # The polite one connected first: had its deadline not been cancelled, it would
            # have been closed before the silent one.
            readable, _, _ = select.select([polite], [], [], 0)
            assert readable == []
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0.0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
