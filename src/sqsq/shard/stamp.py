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

# the hex digit of a UUID's variant nibble (RFC 4122: 10xx) for each random one: its low bits
_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}
IDS_PER_READ = 256


class MessageIdPool:
    """Message ids made ``IDS_PER_READ`` at a time, from one read of the OS's random bytes,
    and handed out in order (each once). Used from the event loop's thread only."""

    def __init__(self, per_read: int = IDS_PER_READ) -> None:
        self._per_read = per_read
        self._ids: list[str] = []
        self._pos = 0

    def take(self, n: int) -> tuple[str, ...]:
        pos = self._pos
        if pos + n > len(self._ids):
            self._ids, pos = _uuid4_texts(max(self._per_read, n)), 0
        self._pos = pos + n
        return tuple(self._ids[pos : pos + n])


def _uuid4_texts(n: int) -> list[str]:
    """``n`` random (version 4) UUIDs as text: what ``str(uuid.uuid4())`` gives, from the
    random bytes' hex digits with the version's and variant's put in (no UUID objects)."""
    h = os.urandom(16 * n).hex()
    v = _VARIANT
    return [f"{h[i : i + 8]}-{h[i + 8 : i + 12]}-4{h[i + 13 : i + 16]}-{v[h[i + 16]]}"
            f"{h[i + 17 : i + 20]}-{h[i + 20 : i + 32]}" for i in range(0, 32 * n, 32)]


_IDS = MessageIdPool()


def message_ids(n: int) -> tuple[str, ...]:
    """``n`` random (version 4) UUIDs as text, none handed out before."""
    return _IDS.take(n)


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
