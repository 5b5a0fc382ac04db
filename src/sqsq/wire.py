"""What the SDK and the server share, and nothing else: the gRPC metadata keys, the signed
token a client sends with each call, the wire shape of the few values both sides convert
(message move tasks), and what direct routing needs to agree on with the gateway (which
partition a FIFO group goes to, which shard a receipt handle names, how a standard queue's
calls spread over its partitions). The SDK
(``sqsq.client``) imports this, never the gateway or shard.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import random
import struct
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, TypeVar

from sqsq.v1 import queues_pb2 as pb

# gRPC metadata: which of a node's shards a call is for (absent: shard 0, as a node of a
# single group is called by the SDK directly).
SHARD_METADATA_KEY = "sqsq-shard"
# gRPC metadata: the caller's region, what the SigV4 credential scope says over HTTP (absent:
# the configured region). Queues of other regions are other queues.
REGION_METADATA_KEY = "sqsq-region"
# gRPC metadata: an Admin call's proof of the admin credential (``sqsq.admincred``).
ADMIN_METADATA_KEY = "sqsq-admin"
# gRPC trailing metadata: the SQS error code of a failure.
ERROR_CODE_KEY = "sqs-error-code"
# What a locked server answers a caller it does not let in (sqsq.gateway.auth).
AUTH_REFUSALS = frozenset({"MissingAuthenticationToken", "InvalidClientTokenId",
                           "SignatureDoesNotMatch", "IncompleteSignature"})
# In an UNAVAILABLE failure's message: the server never started the call (it was shutting
# down), so any call, even one that is not idempotent, may be sent again.
NOT_RUN = "the call was not run"

# ---- the gRPC token (verified by sqsq.gateway.auth) ----------------------------------------
# Metadata ``authorization``: ``SQSQ1 <key id>:<unix time>:<hex signature>``, the signature
# being HMAC-SHA256(secret, "sqsq-grpc-v1\n<key id>\n<time>\n<method>"), so the secret never
# travels and a captured token only replays the same method for a few minutes.
GRPC_METADATA_KEY = "authorization"
GRPC_SCHEME = "SQSQ1"
ENV_KEY_ID = "SQSQ_ACCESS_KEY_ID"
ENV_SECRET = "SQSQ_SECRET_ACCESS_KEY"


def grpc_signature(secret: str, key_id: str, ts: int, method: str) -> str:
    msg = f"sqsq-grpc-v1\n{key_id}\n{ts}\n{method}".encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def grpc_token(key_id: str, secret: str, method: str, now: float | None = None) -> str:
    """The metadata value a client sends with each call."""
    ts = int(time.time() if now is None else now)
    return f"{GRPC_SCHEME} {key_id}:{ts}:{grpc_signature(secret, key_id, ts, method)}"


# ---- the frame connection (sqsq.gateway.frames; sqsq.client._frames) --------------------
# The Stream call's initial metadata: the port of the server's frame connection, and the
# server's id. The SDK's FrameHello names it (a port a client remembers may since belong to
# another server, which refuses it); a hello without one is taken as for this server.
FRAME_PORT_KEY = "sqsq-frame-port"
FRAME_ID_KEY = "sqsq-frame-id"
STREAM_METHOD = "/sqsq.v1.Queues/Stream"  # what a frame connection's token is signed for
MAX_FRAME_BYTES = 4 * 1024 * 1024  # gRPC's default message limit: the stream's limits hold
_LENGTH = struct.Struct(">I")


class FrameError(Exception):
    """The peer sent what is not a frame connection's bytes."""


def varint(n: int) -> bytes:
    """A protobuf varint (``n`` >= 0): what both sides put before the messages they join into
    a frame as bytes, instead of copying each into a frame message to serialize it again."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def framed(message: Any) -> bytes:
    """A protobuf message as it goes on a frame connection: its length, then itself."""
    data = message.SerializeToString()
    return _LENGTH.pack(len(data)) + data


class FrameSplitter:
    """Bytes as they arrive -> whole messages' bytes."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer
        buffer += data
        out = []
        start = 0
        while len(buffer) - start >= 4:
            (size,) = _LENGTH.unpack_from(buffer, start)
            if size > MAX_FRAME_BYTES:
                raise FrameError(f"a frame of {size} bytes, more than {MAX_FRAME_BYTES}")
            if len(buffer) - start - 4 < size:
                break
            out.append(bytes(buffer[start + 4:start + 4 + size]))
            start += 4 + size
        del buffer[:start]
        return out


# ---- message move tasks ------------------------------------------------------------------

# ListMessageMoveTasks result members: SQS's names -> the protobuf fields.
TASK_FIELDS = {
    "TaskHandle": "task_handle",
    "Status": "status",
    "SourceArn": "source_arn",
    "DestinationArn": "destination_arn",
    "MaxNumberOfMessagesPerSecond": "max_number_of_messages_per_second",
    "ApproximateNumberOfMessagesMoved": "approximate_number_of_messages_moved",
    "ApproximateNumberOfMessagesToMove": "approximate_number_of_messages_to_move",
    "FailureReason": "failure_reason",
    "StartedTimestamp": "started_timestamp",
}


def task_to_pb(task: dict[str, Any]) -> pb.MessageMoveTask:
    return pb.MessageMoveTask(**{TASK_FIELDS[k]: v for k, v in task.items() if v is not None})


def task_from_pb(t: pb.MessageMoveTask) -> dict[str, Any]:
    """A task in SQS's (and boto3's) shape; members proto3 cannot mark absent are left out
    when empty, as ``describe`` leaves them out."""
    out: dict[str, Any] = {}
    for member, name in TASK_FIELDS.items():
        value = getattr(t, name)
        if name == "max_number_of_messages_per_second":
            if t.HasField(name):
                out[member] = value
        elif value != "" or isinstance(value, int):
            out[member] = value
    return out


# ---- partitions: what the gateway and the SDK's direct routing both decide ---------------


def group_partition(group_id: str, partitions: int) -> int:
    """The partition of a FIFO message group: stable across gateways, clients and restarts
    (both route by it, so a group's order holds whichever sends)."""
    digest = hashlib.blake2b(group_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def home_partition(queue_key: str, partitions: int) -> int:
    """The partition a standard queue's sends go to while its leader keeps up (``send_width``
    says how many more they take): the same for every client and gateway, so that their
    calls meet in one shard's Raft entries, and different for different queues, so that a
    cluster's queues spread their load over its shards."""
    digest = hashlib.blake2b(b"home:" + queue_key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def send_width(home: int, busy: Sequence[bool]) -> int:
    """How many partitions, from ``home`` on, a standard queue's sends take: up to and
    including the first whose leader is not busy (``busy[p]``: partition p's leader's node
    says its event loop is near full), all of them when every one is."""
    n = len(busy)
    for k in range(n):
        if not busy[(home + k) % n]:
            return k + 1
    return n


def send_partition(turn: int, home: int, width: int, partitions: int) -> int:
    """The partition of a send made at ``turn`` (``SendSpread``): one of the ``width`` from
    ``home`` on; a width of 0 (a route from a gateway that gives none) means all of them."""
    if width <= 0 or width > partitions:
        return turn % partitions
    return (home + turn % width) % partitions


# A standard queue's sends stay on one partition for this many calls, or this long, whichever
# ends first (``SendSpread``), when they take more than one (``send_width``).
BURST_CALLS = 32
BURST_S = 0.01
# A receive looks first where messages were last found; once this long has passed, one
# receive looks first at the next partition (``ReceiveSpread``), so that messages in a
# partition sends no longer reach are found while the others still have some.
RECEIVE_STAY_S = 1.0
MAX_SPREAD_QUEUES = 1024  # queues whose last partition with messages a ReceiveSpread keeps


class _Burst:
    """A turn that holds for ``calls`` calls or ``window_s`` seconds, then moves on by one
    (``SendSpread``'s bookkeeping)."""

    __slots__ = ("turn", "_calls", "_window_s", "_left", "_ends")

    def __init__(self, turn: int, calls: int, window_s: float) -> None:
        self.turn, self._calls, self._window_s = turn, calls, window_s
        self._left, self._ends = 0, float("-inf")

    def take(self, now: float) -> int:
        """The turn for a call made at ``now`` (the next one once this burst is over)."""
        if self._left <= 0 or now >= self._ends:
            self.turn += 1
            self._left, self._ends = self._calls, now + self._window_s
        self._left -= 1
        return self.turn


def _start_turn(start: int | None) -> int:
    return random.randrange(1 << 16) if start is None else start


class SendSpread:
    """The turn a standard queue's next send takes (its partition: ``send_partition``).
    While a send takes more than one partition, calls made close together share a turn: the
    shard they reach commits them in one Raft entry, where spreading them call by call gave
    each of four shards a quarter of every burst, four times the entries (and the Readys,
    fsyncs and frames) per message. A new turn starts after ``calls`` calls or ``window_s``
    seconds, so the partitions still share the load, and a client that sends now and then
    takes them in turn call by call. Each client starts at a random turn, so that clients
    started together do not move in step. Threads of a blocking client may race on it: a
    burst a call longer or shorter, no more."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *,
                 calls: int = BURST_CALLS, window_s: float = BURST_S,
                 start: int | None = None) -> None:
        self._clock = clock
        self._burst = _Burst(_start_turn(start), calls, window_s)

    def turn(self) -> int:
        return self._burst.take(self._clock())


class _Stay:
    __slots__ = ("turn", "probe_at")

    def __init__(self, turn: int, probe_at: float) -> None:
        self.turn, self.probe_at = turn, probe_at


class ReceiveSpread:
    """Where a receive from a queue with several partitions looks first (its turn; the
    partition is ``turn % partitions``): where the last receive found messages; once every
    ``window_s`` seconds, one receive looks first at the next partition instead (a probe:
    its sweep goes on round to where the others look), so that messages in a partition the
    sends no longer reach are found while the others still have some. Sends go to the
    queue's home partition while its leader keeps up (``home_partition``), a burst at a time
    to a few when it does not, so the partition that just had messages likely has more;
    taken in turn call by call, a queue with four partitions on three nodes had most receives
    look at an empty partition first (a call to a shard leader each), and the receives and
    deletes that did find messages were spread over four shards' Raft entries (0.69x the
    messages received per second of one partition, against 0.9-1.0x looking where messages
    were found). One receive probes, not every one: when all of them moved on with the
    window, each receive a client had in flight looked at an empty partition (one receive
    call in nine on steady-10x100B)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *,
                 window_s: float = RECEIVE_STAY_S, queues: int = MAX_SPREAD_QUEUES,
                 start: int | None = None) -> None:
        self._clock, self._window_s = clock, window_s
        self._queues, self._start = queues, start
        self._first: dict[Hashable, _Stay] = {}

    def first(self, queue: Hashable) -> int:
        """The turn a receive from ``queue`` starts at."""
        now = self._clock()
        stay = self._first.get(queue)
        if stay is None:
            while len(self._first) >= self._queues:
                self._first.pop(next(iter(self._first)), None)
            stay = self._first[queue] = _Stay(_start_turn(self._start), now + self._window_s)
            return stay.turn
        if now >= stay.probe_at:
            stay.probe_at = now + self._window_s
            return stay.turn + 1
        return stay.turn

    def found(self, queue: Hashable, turn: int) -> None:
        """A receive from ``queue`` found messages at ``turn``: the next ones start there."""
        stay = self._first.get(queue)
        if stay is not None and stay.turn != turn:
            stay.turn, stay.probe_at = turn, self._clock() + self._window_s


T = TypeVar("T")


async def first_found(polls: list[Awaitable[T]], found: Callable[[T], bool],
                      release: Callable[[int, T], object]) -> tuple[int, T | None]:
    """A receive's long polls at a queue's partitions, all at once: the first answer with
    messages and its place in ``polls``, or (-1, None) when every one ends empty. The others
    are cancelled (a shard makes visible again what a cancelled receive had already taken);
    any other that had answered with messages by then goes to ``release``, as its messages
    were taken for this caller, who gets the winner's. Dropped, they stayed in flight for
    nobody until their visibility timeout ended, and the same cohort could lose that race
    every time it came back. (An answer that comes in while its poll is being cancelled is
    released by the SDK's connection: ``sqsq.client._unclaimed``.)"""
    place = {asyncio.ensure_future(p): k for k, p in enumerate(polls)}
    pending = set(place)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            ended = sorted(done, key=place.__getitem__)
            winners = [t for t in ended if not t.cancelled() and t.exception() is None
                       and found(t.result())]
            if winners:
                for task in winners[1:]:
                    release(place[task], task.result())
                return place[winners[0]], winners[0].result()
            for task in ended:
                task.result()  # a poll that failed: its error is the caller's
        return -1, None
    finally:
        for task in pending:
            task.cancel()


def in_background(held: set[asyncio.Future], work: Awaitable[Any]) -> None:
    """Run ``work`` on its own, kept in ``held`` until it ends (the loop holds its tasks only
    weakly). A best effort, such as a release whose messages otherwise come back at their
    visibility timeout: its failure is dropped."""
    def ended(task: asyncio.Future) -> None:
        held.discard(task)
        if not task.cancelled():
            task.exception()  # (retrieved, so asyncio does not log it as never retrieved)

    task = asyncio.ensure_future(work)
    held.add(task)
    task.add_done_callback(ended)


# A receipt handle (``sqsq.core.receipts``) is URL-safe base64 of a body whose first byte is
# its version and whose next two (big-endian) are its shard, then a MAC. Only a routing hint,
# read without the secret: the shard authenticates the handle.
_HANDLE_VERSION = 1
_HANDLE_CHARS = 68  # body (1 + 2 + 8 + 8 + 4 + 4 + 8) and a 16-byte MAC: 51 bytes, no padding
_URLSAFE_SIXBITS = {c: i for i, c in enumerate(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")}


def shard_of_receipt_handle(text: str) -> int | None:
    """The shard a receipt handle names, or None for what is not one. Only its first four
    characters, its first three bytes (version and shard), are decoded, by table: the SDK
    reads a delete batch's handles here (the first, or each when they begin differently),
    and base64-decoding all 68 was most of what a four-partition queue's deletes cost it
    over a one-partition queue's. A handle
    garbled past them reaches the shard it names, which refuses it as SQS does."""
    if len(text) != _HANDLE_CHARS:
        return None
    six = _URLSAFE_SIXBITS
    try:
        head = six[text[0]] << 18 | six[text[1]] << 12 | six[text[2]] << 6 | six[text[3]]
    except KeyError:
        return None
    return head & 0xFFFF if head >> 16 == _HANDLE_VERSION else None
