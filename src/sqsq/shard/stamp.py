"""The leader's stamp: the random values it puts into a command before proposing it (message
ids, receipt nonces, task handles), so that every replica applying the entry builds the same
state without drawing any of its own."""

from __future__ import annotations

import dataclasses
import os
import secrets

from sqsq.core import commands as c
from sqsq.core import redrive


class RandomPool:
    """The OS's random bytes, read 4 KiB at a time and handed out in pieces: the leader draws
    a few for every command (message ids, receipt nonces), and a read of its own for each
    cost a syscall per command. Used from the event loop's thread only."""

    def __init__(self, read_size: int = 4096) -> None:
        self._read_size = read_size
        self._buf = b""
        self._pos = 0

    def take(self, n: int) -> bytes:
        if self._pos + n > len(self._buf):
            self._buf, self._pos = os.urandom(max(self._read_size, n)), 0
        start = self._pos
        self._pos += n
        return self._buf[start : self._pos]


_RANDOM = RandomPool()


def message_ids(n: int) -> tuple[str, ...]:
    """``n`` random (version 4) UUIDs as text.

    The same strings as ``str(uuid.uuid4())`` n times, at a fraction of the cost: bytes from
    the pool and no UUID objects.
    """
    raw = bytearray(_RANDOM.take(16 * n))
    ids = []
    for i in range(0, 16 * n, 16):
        raw[i + 6] = raw[i + 6] & 0x0F | 0x40  # version 4
        raw[i + 8] = raw[i + 8] & 0x3F | 0x80  # RFC 4122 variant
        h = raw[i : i + 16].hex()
        ids.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return tuple(ids)


def stamp(command: c.Command) -> c.Command:
    """The leader's random values go into the command, so replicas need not draw them."""
    if isinstance(command, c.SendMessages):
        ids = message_ids(len(command.entries))
        return c.SendMessages(command.queue, command.entries, command.request_id, ids)
    if isinstance(command, c.ReceiveMessages):  # (built as is: dataclasses.replace costs ~1 us)
        return c.ReceiveMessages(command.queue, command.max_number_of_messages,
                                 command.visibility_timeout_s,
                                 int.from_bytes(_RANDOM.take(8), "big"),
                                 command.receive_request_attempt_id)
    if isinstance(command, redrive.StartMoveTask) and not command.task_handle:
        return dataclasses.replace(command, task_handle=secrets.token_urlsafe(24))
    return command
