"""What the SDK and the server share, and nothing else: the gRPC metadata keys, the signed
token a client sends with each call, the wire shape of the few values both sides convert
(message move tasks), and what direct routing needs to agree on with the gateway (which
partition a FIFO group goes to, which shard a receipt handle names). The SDK
(``sqsq.client``) imports this, never the gateway or shard.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct
import time
from typing import Any

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


# A receipt handle (``sqsq.core.receipts``) is URL-safe base64 of a body whose first byte is
# its version and whose next two (big-endian) are its shard, then a MAC. Only a routing hint,
# read without the secret: the shard authenticates the handle.
_HANDLE_VERSION = 1
_HANDLE_BYTES = 51  # body (1 + 2 + 8 + 8 + 4 + 4 + 8) and a 16-byte MAC
_HANDLE_SHARD = struct.Struct(">BH")


def shard_of_receipt_handle(text: str) -> int | None:
    """The shard a receipt handle names, or None for what is not one."""
    if not text or len(text) > 256:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    if len(raw) != _HANDLE_BYTES:
        return None
    version, shard = _HANDLE_SHARD.unpack_from(raw)
    return shard if version == _HANDLE_VERSION else None
