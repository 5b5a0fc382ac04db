"""The frame connection's writes: the replies ready in one turn of the event loop leave in
one frame (one write), each call still gets its own reply, the connection closes once the
client has half-closed and every call is answered, and a lost connection cancels the calls
still running."""

from __future__ import annotations

import asyncio
from typing import Any

from sqsq.api import Endpoint
from sqsq.core import commands as c
from sqsq.gateway.auth import Authenticator
from sqsq.gateway.frames import FrameServer, _Connection
from sqsq.gateway.grpc_service import QueuesService
from sqsq.prompt import PromptFuture
from sqsq.shard.service import ShardService
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import FrameSplitter, framed

ENDPOINT = Endpoint("http://127.0.0.1:9324")


class _Replica:
    def is_leader(self) -> bool:
        return True


class _Engine:
    """Answers each send once ``release`` is set (as a commit would), with a message id per
    entry."""

    replica = _Replica()

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running = 0
        self.cancelled = 0
        self.cancelled_one = asyncio.Event()

    async def execute(self, command: Any) -> c.BatchResult:
        self.running += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            self.cancelled_one.set()
            raise
        return c.BatchResult(tuple(
            c.SentMessage(e.entry_id, f"id-{command.request_id}-{e.entry_id}", "md5", None,
                          None) for e in command.entries), ())

    def submit(self, command: Any) -> Any:
        return self.execute(command)


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def frames(self) -> list[pb.StreamReplyFrame]:
        splitter = FrameSplitter()
        return [pb.StreamReplyFrame.FromString(m)
                for data in self.writes for m in splitter.feed(data)]


def _sends(ids: range) -> bytes:
    frame = pb.StreamRequestFrame()
    for i in ids:
        call = frame.calls.add(id=i, timeout_ms=60_000)
        call.send_message_batch.queue_url = ENDPOINT.queue_url("q1")
        call.send_message_batch.request_id = f"r{i}"
        call.send_message_batch.entries.add(id="0", message_body="hello")
        call.send_message_batch.entries.add(id="1", message_body="world")
    return framed(frame)


async def _open() -> tuple[_Engine, _Connection, _Transport]:
    engine = _Engine()
    server = FrameServer(QueuesService(api=ShardService(engine, ENDPOINT)),  # type: ignore[arg-type]
                         Authenticator({}))
    connection, transport = _Connection(server), _Transport()
    connection.connection_made(transport)
    connection.data_received(framed(pb.FrameHello()))
    assert transport.frames() == [pb.StreamReplyFrame()]  # accepted
    transport.writes.clear()
    return engine, connection, transport


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_replies_ready_together_leave_in_one_write_each_with_its_own_answer() -> None:
    async def run() -> None:
        engine, connection, transport = await _open()
        connection.data_received(_sends(range(1, 6)))
        await _settle()
        assert engine.running == 5 and transport.writes == []  # nothing answered yet
        engine.release.set()
        await _settle()
        assert len(transport.writes) == 1
        (frame,) = transport.frames()
        assert sorted(r.id for r in frame.replies) == [1, 2, 3, 4, 5]
        for reply in frame.replies:
            sent = reply.send_message_batch
            assert [(e.id, e.message_id) for e in sent.successful] == [
                ("0", f"id-r{reply.id}-0"), ("1", f"id-r{reply.id}-1")]
            assert sent.successful[0].md5_of_message_body == "md5"
            assert sent.successful[0].sequence_number == ""
        connection.eof_received()  # the client half-closes: every call is answered
        await _settle()
        assert transport.closed and connection.ended.done()

    asyncio.run(run())


def test_calls_reach_their_engine_in_the_turn_of_the_loop_that_read_them() -> None:
    # (run by a task each, they waited a turn first: on a lone send, a turn of the leader's
    # loop on every call's way to its proposer)
    async def run() -> None:
        engine, connection, transport = await _open()
        connection.data_received(_sends(range(1, 4)))
        assert engine.running == 3  # no turn of the loop has passed
        engine.release.set()
        await _settle()
        (frame,) = transport.frames()
        assert sorted(r.id for r in frame.replies) == [1, 2, 3]

    asyncio.run(run())


def test_a_lone_calls_reply_is_written_as_it_is_answered_not_a_loop_turn_later() -> None:
    async def run() -> None:
        engine, connection, transport = await _open()
        session = connection._session
        assert session is not None
        put = session._put
        written_when_put: list[int] = []

        def putting(item: Any) -> None:
            put(item)
            written_when_put.append(len(transport.writes))
        session._put = putting  # type: ignore[method-assign]
        connection.data_received(_sends(range(1, 2)))
        await _settle()
        engine.release.set()
        await _settle()
        assert written_when_put == [1]
        assert [r.id for f in transport.frames() for r in f.replies] == [1]

    asyncio.run(run())


def test_a_lone_calls_reply_is_written_in_the_call_that_answers_it() -> None:
    # (a shard engine answers with a PromptFuture: the stream call takes its next step as the
    # answer is set, not a loop turn later, when the loop would read whatever came meanwhile
    # first)
    async def run() -> None:
        engine, connection, transport = await _open()
        answers: list[PromptFuture] = []

        def submit(command: Any) -> PromptFuture:
            answers.append(PromptFuture())
            return answers[-1]
        engine.submit = submit  # type: ignore[method-assign]
        connection.data_received(_sends(range(1, 2)))
        (answer,) = answers
        answer.set_result(c.BatchResult((
            c.SentMessage("0", "id-0", "md5", None, None),
            c.SentMessage("1", "id-1", "md5", None, None)), ()))
        (frame,) = transport.frames()  # no turn of the loop has passed
        assert [r.id for r in frame.replies] == [1]
        assert [e.message_id for e in frame.replies[0].send_message_batch.successful] == [
            "id-0", "id-1"]

    asyncio.run(run())


def test_calls_of_one_frame_answered_at_once_leave_in_one_write() -> None:
    async def run() -> None:
        engine, connection, transport = await _open()
        engine.release.set()  # each call is answered in its first step
        connection.data_received(_sends(range(1, 6)))
        assert transport.writes == []  # (not one write per call as each started)
        await _settle()
        assert len(transport.writes) == 1
        (frame,) = transport.frames()
        assert sorted(r.id for r in frame.replies) == [1, 2, 3, 4, 5]

    asyncio.run(run())


def test_a_half_closed_connection_stays_open_until_its_last_reply() -> None:
    async def run() -> None:
        engine, connection, transport = await _open()
        connection.data_received(_sends(range(1, 3)))
        await _settle()
        connection.eof_received()
        await _settle()
        assert not transport.closed
        engine.release.set()
        await _settle()
        assert [r.id for f in transport.frames() for r in f.replies] == [1, 2]
        assert transport.closed and connection.ended.done()

    asyncio.run(run())


def test_a_lost_connection_cancels_the_calls_still_running() -> None:
    async def run() -> None:
        engine, connection, transport = await _open()
        connection.data_received(_sends(range(1, 4)))
        await _settle()
        connection.connection_lost(ConnectionResetError())
        await _settle()
        assert engine.cancelled == 3
        assert connection.ended.done() and transport.writes == []

    asyncio.run(run())


def test_replies_wait_while_the_transport_is_paused() -> None:
    async def run() -> None:
        engine, connection, transport = await _open()
        connection.data_received(_sends(range(1, 3)))
        connection.pause_writing()
        engine.release.set()
        await _settle()
        assert transport.writes == []
        connection.resume_writing()
        await _settle()
        assert [r.id for f in transport.frames() for r in f.replies] == [1, 2]

    asyncio.run(run())


def test_a_call_past_its_deadline_is_cancelled_and_one_within_it_runs_on() -> None:
    async def run() -> None:
        engine, connection, transport = await _open()
        frame = pb.StreamRequestFrame()
        for call_id, timeout_ms in ((1, 60_000), (2, 50), (3, 60_000)):
            call = frame.calls.add(id=call_id, timeout_ms=timeout_ms)
            call.send_message_batch.queue_url = ENDPOINT.queue_url("q1")
            call.send_message_batch.entries.add(id="0", message_body="hello")
        connection.data_received(framed(frame))
        await asyncio.wait_for(engine.cancelled_one.wait(), 10)  # call 2's deadline passed
        await _settle()
        assert engine.cancelled == 1 and transport.writes == []  # nobody waits for its reply
        engine.release.set()
        await _settle()
        assert sorted(r.id for f in transport.frames() for r in f.replies) == [1, 3]

    asyncio.run(run())


def _read(connection: _Connection, data: bytes, cut: int) -> None:
    """``data`` as the event loop reads it: into the connection's own buffer, in two reads
    cut at ``cut``."""
    for piece in (data[:cut], data[cut:]):
        if piece:
            buffer = connection.get_buffer(-1)
            buffer[:len(piece)] = piece
            connection.buffer_updated(len(piece))


def test_calls_read_into_the_connections_buffer_arrive_whole_wherever_a_read_ends() -> None:
    async def run() -> None:
        data = _sends(range(1, 3)) + _sends(range(3, 4))
        for cut in range(len(data) + 1):
            engine, connection, transport = await _open()
            _read(connection, data, cut)
            await _settle()
            assert engine.running == 3, cut
            engine.release.set()
            await _settle()
            assert sorted(r.id for f in transport.frames() for r in f.replies) == [1, 2, 3]
            connection.connection_lost(None)

    asyncio.run(run())
