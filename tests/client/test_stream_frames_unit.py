"""The SDK writes a stream's calls as bytes it joins (``sqsq.client._stream._request`` and
``_frame``): they must be the frames protobuf would have serialized, call for call. And it
reads the replies into its connection's own buffer, whole wherever a read ends."""

from __future__ import annotations

import asyncio

import pytest

from sqsq.client._frames import AioFrameStream, _Protocol
from sqsq.client._stream import _NOTHING, MAX_FRAME_CALLS, _cancel, _frame, _request
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import framed

SEND = pb.SendMessageBatchRequest(
    queue_url="http://127.0.0.1:9324/000000000000/q", request_id="r" * 32,
    entries=[pb.SendMessageBatchEntry(id=str(i), message_body="b\u00e9" * 70) for i in range(3)])


def _built(call_id: int, timeout_ms: int, metadata: dict[str, str]) -> pb.StreamRequest:
    out = pb.StreamRequest(id=call_id, metadata=metadata, timeout_ms=timeout_ms)
    out.send_message_batch.CopyFrom(SEND)
    return out


@pytest.mark.parametrize(("call_id", "timeout", "timeout_ms", "metadata"), [
    (1, None, 0, {}),
    (300, 60.0, 60000, {}),
    (2**40, 0.0001, 1, {}),  # an id past 32 bits; a timeout rounded up to 1 ms
    (7, 5.0, 5000, {"sqsq-region": "eu-west-1", "sqsq-shard": "3"}),
])
def test_a_call_is_the_bytes_protobuf_writes(call_id: int, timeout: float | None,
                                             timeout_ms: int, metadata: dict[str, str]) -> None:
    part, size = _request(call_id, "send_message_batch", SEND.SerializeToString(), timeout,
                          tuple(metadata.items()))
    frame, held = _frame((part, size), lambda: None)
    expected = pb.StreamRequestFrame(calls=[_built(call_id, timeout_ms, metadata)])
    assert pb.StreamRequestFrame.FromString(frame) == expected and size == len(frame)
    if not metadata:  # (a map's entries may come in any order)
        assert frame == expected.SerializeToString()
    assert held is None


def test_calls_share_a_frame_in_order_up_to_its_limits() -> None:
    body = SEND.SerializeToString()
    outbox = [_request(i, "send_message_batch", body, 1.0, None)
              for i in range(2, MAX_FRAME_CALLS + 3)] + [_cancel(9)]
    frame, held = _frame(_request(1, "send_message_batch", body, 1.0, None), outbox.pop)
    calls = pb.StreamRequestFrame.FromString(frame).calls
    assert len(calls) == MAX_FRAME_CALLS
    assert calls[0].id == 1 and calls[1].HasField("cancel") and calls[1].id == 9
    assert calls[2].id == MAX_FRAME_CALLS + 2 and calls[2].send_message_batch == SEND
    assert held is _NOTHING and len(outbox) == 3  # the rest wait for the next frame


def test_a_call_that_would_pass_the_frame_size_waits_for_the_next() -> None:
    big = pb.SendMessageBatchRequest(entries=[pb.SendMessageBatchEntry(
        message_body="x" * (3 * 1024 * 1024))]).SerializeToString()
    first, second = (_request(i, "send_message_batch", big, None, None) for i in (1, 2))
    frame, held = _frame(first, lambda: second)
    assert [c.id for c in pb.StreamRequestFrame.FromString(frame).calls] == [1]
    assert held == second


def test_replies_read_into_the_connections_buffer_arrive_whole_wherever_a_read_ends() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        frames = [pb.StreamReplyFrame(replies=[pb.StreamReply(id=i) for i in ids])
                  for ids in ((1, 2), (3,))]
        data = b"".join(framed(f) for f in frames)
        for cut in range(len(data) + 1):
            stream = AioFrameStream()
            protocol = _Protocol(stream)
            waiting = {i: loop.create_future() for i in (1, 2, 3)}
            stream.pending.update(waiting)
            for piece in (data[:cut], data[cut:]):  # two reads, as the event loop makes them
                if piece:
                    buffer = protocol.get_buffer(-1)
                    buffer[:len(piece)] = piece
                    protocol.buffer_updated(len(piece))
            assert all(f.done() for f in waiting.values()), cut
            assert [waiting[i].result().id for i in (1, 2, 3)] == [1, 2, 3]

    asyncio.run(run())
