"""Snapshot files between two nodes, in chunks over the peers' one connection.

The sender reads the file a chunk at a time in a worker thread and writes each chunk only
once the one before has left the socket buffer, so message frames of other shards (which go
out every loop turn) wait behind one chunk at most, never behind the whole file. The
receiver appends chunks to a staging file; only when the last one arrived does it fsync,
rename to the final name and fsync the directory, then hand the file on and acknowledge.
A transfer cut short (connection lost, a chunk out of order, a disk error) leaves no file
behind, and the sender learns it failed: Raft must then probe the follower again, never
assume it holds the snapshot (finding 5 of issue 31).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from sqsq.raft.types import Message
from sqsq.shard.raftwire import Chunk

log = logging.getLogger("sqsq.peers")

PART_SUFFIX = ".part"
SNAP_SUFFIX = ".snap"


@dataclass
class Incoming:
    """A transfer being received: its snapshot's place and the staging file so far."""

    shard: int
    index: int
    term: int
    message: Message
    path: Path
    file: BinaryIO
    next_seq: int = 1
    size: int = 0


@dataclass
class Receiving:
    """One connection's transfers in progress, and those refused (a local disk error): the
    sender's remaining chunks of those are read and ignored until their last."""

    staging: Path
    max_transfers: int
    max_bytes: int
    transfers: dict[int, Incoming] = field(default_factory=dict)
    refused: set[int] = field(default_factory=set)

    def take(self, chunk: Chunk) -> Incoming | None:
        """Write ``chunk``; the transfer once its last chunk is written (the caller makes it
        durable), else None. ``ValueError``: the sender broke the protocol. ``OSError``: our
        disk failed; the transfer is discarded and its id refused."""
        if chunk.transfer in self.refused:
            if chunk.last:
                self.refused.discard(chunk.transfer)
            return None
        inc = self.transfers.get(chunk.transfer)
        if chunk.seq == 0:
            if inc is not None:
                raise ValueError(f"snapshot transfer {chunk.transfer} started twice")
            if len(self.transfers) >= self.max_transfers:
                raise ValueError(f"more than {self.max_transfers} snapshot transfers at once")
            assert chunk.message is not None  # decode_chunk checked it
            path = self.staging / (f"snap-{chunk.shard}-{chunk.index}-{chunk.term}-"
                                   f"{secrets.token_hex(6)}{PART_SUFFIX}")
            try:
                file = open(path, "xb")  # noqa: SIM115 - kept open across chunks
            except OSError:
                if not chunk.last:
                    self.refused.add(chunk.transfer)
                raise
            inc = Incoming(chunk.shard, chunk.index, chunk.term, chunk.message, path, file,
                           next_seq=0)
            self.transfers[chunk.transfer] = inc
        elif inc is None or (inc.shard, inc.index, inc.term) != (
                chunk.shard, chunk.index, chunk.term) or chunk.seq != inc.next_seq:
            raise ValueError(f"snapshot chunk {chunk.seq} of transfer {chunk.transfer} "
                             "out of order")
        inc.size += len(chunk.data)
        if inc.size > self.max_bytes:
            raise ValueError(f"a snapshot of more than {self.max_bytes} bytes")
        try:
            # To the page cache: quick; the fsync, which waits for the disk, is in a thread.
            inc.file.write(chunk.data)
        except OSError:
            self.discard(chunk.transfer)
            if not chunk.last:
                self.refused.add(chunk.transfer)
            raise
        inc.next_seq += 1
        if chunk.last:
            del self.transfers[chunk.transfer]
            return inc
        return None

    def discard(self, transfer: int) -> None:
        inc = self.transfers.pop(transfer, None)
        if inc is not None:
            inc.file.close()
            with contextlib.suppress(FileNotFoundError):
                inc.path.unlink()

    def discard_all(self) -> int:
        count = len(self.transfers)
        for transfer in list(self.transfers):
            self.discard(transfer)
        self.refused.clear()
        return count


def make_durable(inc: Incoming) -> Path:
    """In a worker thread: the staging file fsynced, renamed to its final name, the rename
    made durable; the final path. On failure nothing is left behind."""
    final = inc.path.with_suffix(SNAP_SUFFIX)
    try:
        inc.file.flush()
        os.fsync(inc.file.fileno())
        inc.file.close()
        os.replace(inc.path, final)
        fd = os.open(inc.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        inc.file.close()
        for p in (inc.path, final):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        raise
    return final


async def stream_file(path: Path, chunk_bytes: int,
                      send: Callable[[bytes, bool], Awaitable[None]]) -> int:
    """Read ``path`` a chunk at a time (in a worker thread) and pass each to ``send(data,
    last)``, which returns once the chunk left (the socket buffer drained); the bytes sent.
    Reads one chunk ahead to know which is the last."""
    loop = asyncio.get_running_loop()
    f = await asyncio.to_thread(open, path, "rb")
    sent = 0
    try:
        data = await loop.run_in_executor(None, f.read, chunk_bytes)
        while True:
            ahead = (await loop.run_in_executor(None, f.read, chunk_bytes)
                     if len(data) == chunk_bytes else b"")
            await send(data, not ahead)
            sent += len(data)
            if not ahead:
                return sent
            data = ahead
    finally:
        # Closed in a worker too: if a read is still blocked there (this task cancelled),
        # closing here would wait for it on the event loop.
        loop.run_in_executor(None, f.close)
