"""A server shutting down drains its streams: the client is told, stops sending on the stream
and half-closes it; every call it had sent gets an answer (run, or refused "not run", which
any call may send again), and nothing is left unanswered in between."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from sqsq.client._call import Call, may_retry
from sqsq.client._stream import _reply_error
from sqsq.gateway.streaming import StreamSession
from sqsq.v1 import queues_pb2 as pb


class Requests:
    """The client half of a stream, driven by the test: frames in, a half-close at the end."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[pb.StreamRequestFrame | None] = asyncio.Queue()

    def send(self, *ids: int) -> None:
        self.queue.put_nowait(pb.StreamRequestFrame(calls=[
            pb.StreamRequest(id=i, send_message=pb.SendMessageRequest(message_body=str(i)))
            for i in ids]))

    def half_close(self) -> None:
        self.queue.put_nowait(None)

    def __aiter__(self) -> AsyncIterator[pb.StreamRequestFrame]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[pb.StreamRequestFrame]:
        while (frame := await self.queue.get()) is not None:
            yield frame


def test_a_draining_stream_answers_every_call_sent_and_ends_at_the_half_close() -> None:
    async def main() -> None:
        release = asyncio.Event()
        ran: list[int] = []

        async def call(kind: str, request: Any, context: Any) -> bytes:
            await release.wait()
            ran.append(int(request.message_body))
            return pb.StreamReply(
                send_message=pb.SendMessageResponse(message_id="m")).SerializeToString()

        session = StreamSession(call, ())
        requests = Requests()
        replies = session.replies(requests)
        requests.send(1, 2)
        nxt = asyncio.ensure_future(replies.__anext__())
        await asyncio.sleep(0.01)
        session.drain()
        first = await nxt
        assert first.draining and not first.replies  # the client is told at once
        requests.send(3)  # already on its way when the client heard
        refused = await replies.__anext__()
        [late] = refused.replies
        assert late.id == 3 and late.WhichOneof("result") == "error"
        err = _reply_error(late.error)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert may_retry(Call("ReceiveMessage", None, lambda r: r), err)  # any call may
        release.set()
        answered = {r.id for r in (await replies.__anext__()).replies}
        while answered != {1, 2}:
            answered |= {r.id for r in (await replies.__anext__()).replies}
        assert sorted(ran) == [1, 2]  # the calls under way ran; 3 never did
        ended = asyncio.ensure_future(replies.__anext__())
        await asyncio.sleep(0.05)
        assert not ended.done()  # open until the client half-closes: nothing can be lost
        requests.half_close()
        try:
            await ended
            raise AssertionError("the stream went on after the half-close")
        except StopAsyncIteration:
            pass

    asyncio.run(main())
