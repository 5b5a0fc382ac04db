"""A stream's replies travel as bytes, serialized once: a call's reply and the frames that
carry replies parse to exactly the messages they stand for (ids, results, errors, the
draining flag), and a reply too large for a frame ends only its own call."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from sqsq.gateway import streaming
from sqsq.gateway.streaming import StreamSession, error_reply, result_bytes
from sqsq.v1 import queues_pb2 as pb

RESPONSES = {
    "send_message_batch": pb.SendMessageBatchResponse(successful=[
        pb.SendMessageBatchResultEntry(id=str(i), message_id=f"m{i}", md5_of_message_body="d")
        for i in range(10)]),
    "receive_message": pb.ReceiveMessageResponse(messages=[
        pb.Message(message_id="m", receipt_handle="h" * 300, body="\u00e9" * 200)]),
    "delete_message": pb.Empty(),
    "get_queue_attributes": pb.GetQueueAttributesResponse(attributes={"a": "1", "b": "2"}),
}


@pytest.mark.parametrize("kind", list(RESPONSES))
def test_a_result_is_the_reply_with_that_field_set(kind: str) -> None:
    data = result_bytes(kind, RESPONSES[kind])
    # (parsed, not byte for byte: protobuf writes a map's entries in no fixed order)
    assert pb.StreamReply.FromString(data) == pb.StreamReply(**{kind: RESPONSES[kind]})
    assert pb.StreamReply.FromString(data).WhichOneof("result") == kind


def _frames(session: StreamSession) -> list[pb.StreamReplyFrame]:
    out = []
    while session.has_replies():
        frame, ended = session.take_frame()
        if frame is not None:
            out.append(pb.StreamReplyFrame.FromString(frame))
        if ended:
            break
    return out


def test_replies_ready_together_share_a_frame_with_their_own_ids() -> None:
    async def main() -> None:
        async def call(kind: str, request: Any, context: Any) -> bytes:
            if request.queue_url == "fail":
                return error_reply(grpc.StatusCode.NOT_FOUND, "QueueDoesNotExist",
                                   "gone").SerializeToString()
            return result_bytes(kind, RESPONSES[kind])

        session = StreamSession(call, ())
        ids = [0, 1, 127, 128, 2**40, 2**64 - 1]  # varints of every width, and no field at 0
        session.received(pb.StreamRequestFrame(calls=[
            pb.StreamRequest(id=i, receive_message=pb.ReceiveMessageRequest(
                queue_url="fail" if i == 128 else "q")) for i in ids]))
        for _ in range(5):
            await asyncio.sleep(0)
        session.drain()
        session.input_ended()
        frames = _frames(session)
        assert [f.draining for f in frames] == [True]  # one frame: the replies and the flag
        replies = {r.id: r for r in frames[0].replies}
        assert sorted(replies) == ids
        for i, r in replies.items():
            if i == 128:
                assert (r.error.code, r.error.message) == ("QueueDoesNotExist", "gone")
            else:
                assert r.receive_message == RESPONSES["receive_message"]
        assert session.take_frame() == (None, True)  # every call answered, half-closed

    asyncio.run(main())


def test_a_reply_too_large_for_a_frame_ends_only_its_call(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(streaming, "MAX_REPLY_BYTES", 1000)

    async def main() -> None:
        async def call(kind: str, request: Any, context: Any) -> bytes:
            size = int(request.queue_url)
            return result_bytes(kind, pb.ReceiveMessageResponse(
                messages=[pb.Message(body="x" * size)]))

        session = StreamSession(call, ())
        session.received(pb.StreamRequestFrame(calls=[
            pb.StreamRequest(id=1, receive_message=pb.ReceiveMessageRequest(queue_url="5000")),
            pb.StreamRequest(id=2, receive_message=pb.ReceiveMessageRequest(queue_url="10")),
        ]))
        for _ in range(5):
            await asyncio.sleep(0)
        [frame] = _frames(session)
        big, small = sorted(frame.replies, key=lambda r: r.id)
        assert big.error.status == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert "more than the 1000" in big.error.message
        assert small.receive_message.messages[0].body == "x" * 10

    asyncio.run(main())
