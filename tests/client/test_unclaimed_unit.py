"""A receive given up on whose answer came in all the same: its messages are released on the
same connection (``sqsq.client._unclaimed``), not left in flight for nobody until their
visibility timeout ends. No network: the connection's frames are read back as written."""

from __future__ import annotations

import asyncio

import pytest

from sqsq.client._stream import _AioCalls
from sqsq.v1 import queues_pb2 as pb

QUEUE = "http://127.0.0.1:9324/000000000000/q"
SHARD = (("sqsq-shard", "3"),)


class Connection(_AioCalls):
    """Calls as the requests they write; replies handed in by the test."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[pb.StreamRequest] = []

    def _send(self, outgoing: tuple[bytes, int]) -> None:
        self.sent.extend(pb.StreamRequestFrame.FromString(outgoing[0]).calls)

    def releases(self) -> list[tuple[dict[str, str], list[tuple[str, int]]]]:
        return [(dict(r.metadata), [(e.receipt_handle, e.visibility_timeout)
                                    for e in r.change_message_visibility_batch.entries])
                for r in self.sent if r.WhichOneof("call") == "change_message_visibility_batch"]


def _receive(conn: Connection) -> asyncio.Task:
    body = pb.ReceiveMessageRequest(queue_url=QUEUE, wait_time_seconds=5).SerializeToString()
    return asyncio.ensure_future(conn.call("receive_message", body, 10.0, SHARD))


def _answer(call_id: int, *handles: str) -> pb.StreamReply:
    reply = pb.StreamReply(id=call_id)
    reply.receive_message.SetInParent()
    for h in handles:
        reply.receive_message.messages.add(message_id=h, receipt_handle=h, body="b")
    return reply


@pytest.mark.parametrize("when", ["on its way back", "in before its caller resumed"])
def test_an_answer_to_a_receive_given_up_on_is_released(when: str) -> None:
    async def go() -> list:
        conn = Connection()
        poll = _receive(conn)
        await asyncio.sleep(0)  # the call is written
        call_id = conn.sent[0].id
        if when == "on its way back":
            poll.cancel()
            await asyncio.sleep(0)  # the cancel is written
            assert conn.sent[-1].WhichOneof("call") == "cancel"
            conn._deliver([_answer(call_id, "h1", "h2")])
        else:
            conn._deliver([_answer(call_id, "h1", "h2")])
            poll.cancel()  # before the call's task resumed with the answer
        with pytest.raises(asyncio.CancelledError):
            await poll
        await asyncio.sleep(0)  # the release is written
        return conn.releases()

    assert asyncio.run(go()) == [({"sqsq-shard": "3"}, [("h1", 0), ("h2", 0)])]


def test_an_answer_taken_by_its_caller_or_empty_releases_nothing() -> None:
    async def go() -> list:
        conn = Connection()
        taken, empty = _receive(conn), _receive(conn)
        await asyncio.sleep(0)
        conn._deliver([_answer(conn.sent[0].id, "h1")])
        assert len((await taken).messages) == 1
        empty.cancel()
        await asyncio.sleep(0)
        conn._deliver([_answer(conn.sent[1].id)])  # nothing taken for it
        with pytest.raises(asyncio.CancelledError):
            await empty
        await asyncio.sleep(0)
        return conn.releases()

    assert asyncio.run(go()) == []
