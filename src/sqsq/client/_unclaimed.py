"""Receives given up on whose answers came in all the same: their messages are released.

A caller that stops waiting for a receive (a partitioned queue's long poll that lost to
another partition's answer, a deadline, a task cancelled) sends a cancel; a shard that had
already taken messages for it either releases them itself (the cancel reached it before the
receive's entry was applied) or has answered. An answer that was on its way back, or that
had come in while its caller was being cancelled, used to be dropped, and its messages
stayed in flight for nobody until their visibility timeout ended; messages that come back
together come back together, so the same ones could lose that race every time. Such an
answer's messages are now made visible again at once (a visibility change to 0, on the same
connection with the same metadata: the receive's shard and region).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from sqsq.client._ops import release_messages
from sqsq.v1 import queues_pb2 as pb
from sqsq.wire import in_background

RECEIVE = "receive_message"
RELEASE = "change_message_visibility_batch"
RELEASE_TIMEOUT_S = 5.0
# Receives given up on whose answers may still come. A shard that stopped one in time sends
# nothing, so entries are never settled by an answer: the oldest are forgotten past this.
MAX_GIVEN_UP = 256

Metadata = Sequence[tuple[str, str]]
Call = Callable[[str, bytes, float | None, Metadata], Any]


class Unclaimed:
    """One connection's receives given up on; ``call`` makes a call on that connection."""

    def __init__(self, call: Call) -> None:
        self._call = call
        self._given_up: dict[int, tuple[bytes, Metadata]] = {}
        self._releases: set[asyncio.Future] = set()  # ``in_background``

    def given_up(self, call_id: int, field: str, body: bytes, metadata: Metadata) -> None:
        """A receive cancelled before its answer came: if one still comes, release it."""
        if field != RECEIVE:
            return
        given = self._given_up
        while len(given) >= MAX_GIVEN_UP:
            given.pop(next(iter(given)))
        given[call_id] = (body, metadata)

    def late(self, reply: pb.StreamReply) -> None:
        """An answer for no call waiting: a receive's given up on, or nothing of ours."""
        given = self._given_up.pop(reply.id, None)
        if given is not None:
            self.arrived(RECEIVE, *given, reply)

    def arrived(self, field: str, body: bytes, metadata: Metadata,
                reply: pb.StreamReply) -> None:
        """``reply`` came for a call whose caller no longer takes it."""
        if field != RECEIVE or reply.WhichOneof("result") != RECEIVE:
            return
        messages = reply.receive_message.messages
        if not messages:
            return
        queue = pb.ReceiveMessageRequest.FromString(body).queue_url
        request = release_messages(queue, messages).request
        in_background(self._releases, self._call(RELEASE, request.SerializeToString(),
                                                 RELEASE_TIMEOUT_S, metadata))
