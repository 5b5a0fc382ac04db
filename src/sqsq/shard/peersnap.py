"""The snapshot half of ``PeerTransport``: sending a file in chunks, and taking one in.

A mixin so that ``sqsq.shard.peers`` stays about connections and messages; it uses the
transport's connections (``Link``), counters and task set. The file-level pieces (staging,
fsync, reading in a worker thread) are ``sqsq.shard.snapxfer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqsq.raft.types import Message
from sqsq.shard import snapxfer
from sqsq.shard.peerlink import KIND_ABORT, KIND_ACK, KIND_CHUNK, Link, PeerState
from sqsq.shard.raftwire import Chunk, encode_ack, encode_chunk

if TYPE_CHECKING:
    from sqsq.shard.peers import OnSnapshot

log = logging.getLogger("sqsq.peers")

CONNECT_TIMEOUT_S = 5.0  # a snapshot for a peer not connected waits this long for it


class _Refused(Exception):
    """The receiver gave the transfer up (its disk): stop sending it."""


class SnapshotTransfers:
    # What the transport provides (sqsq.shard.peers.PeerTransport).
    on_snapshot: OnSnapshot
    chunk_bytes: int
    _stopped: bool
    _transfer_ids: itertools.count
    snapshots_sent: int
    snapshots_failed: int
    snapshots_received: int
    snapshots_discarded: int

    def _peer(self, peer_id: str, address: tuple[str, int] | None) -> PeerState: ...
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task: ...
    def _dial_soon(self, peer: PeerState) -> None: ...
    def _write(self, link: Link, kind: int, payload: bytes) -> None: ...

    # ---- sending -----------------------------------------------------------------------

    def send_snapshot(self, peer_id: str, address: tuple[str, int], shard_id: int,
                      message: Message, path: Path) -> asyncio.Future[bool]:
        """Stream the snapshot file ``path`` (for ``message``, a SNAPSHOT) to ``peer_id``.
        The future is True once the peer holds it whole and durably, False if the transfer
        failed (the host then calls ``RaftNode.snapshot_failed``); it never raises."""
        if message.snapshot is None:
            raise ValueError("a snapshot transfer needs a SNAPSHOT message")
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._stopped:
            self._settle(done, False)
            return done
        peer = self._peer(peer_id, address)
        self._spawn(self._send_snapshot(peer, shard_id, message, path, done))
        return done

    async def _send_snapshot(self, peer: PeerState, shard_id: int, message: Message,
                             path: Path, done: asyncio.Future[bool]) -> None:
        transfer = next(self._transfer_ids)
        meta = message.snapshot
        assert meta is not None
        link: Link | None = None
        seq = itertools.count()
        try:
            self._dial_soon(peer)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(peer.connected.wait(), CONNECT_TIMEOUT_S)
            link = peer.active()
            if link is None:
                raise ConnectionError(f"no connection to {peer.id}")
            link.outgoing[transfer] = done
            sending = link

            async def chunk(data: bytes, last: bool) -> None:
                if done.done():
                    raise _Refused
                if sending.closed:
                    raise ConnectionError("the connection was lost")
                n = next(seq)
                self._write(sending, KIND_CHUNK, encode_chunk(Chunk(
                    transfer, n, last, shard_id, meta.index, meta.term, data,
                    message if n == 0 else None)))
                # The next chunk waits until this one left the socket buffer: other shards'
                # frames, written every loop turn, queue behind one chunk at most.
                await sending.drain()

            await snapxfer.stream_file(path, self.chunk_bytes, chunk)
            # All sent; ``done`` is settled by the peer's acknowledgement or the link's loss.
        except (OSError, ConnectionError, _Refused) as e:
            if not isinstance(e, _Refused):
                log.warning("snapshot of shard %d to %s failed: %s", shard_id, peer.id, e)
            if link is not None and not link.closed:
                link.outgoing.pop(transfer, None)
                self._write(link, KIND_ABORT, encode_ack(transfer, False))
            self._settle(done, False)

    def _settle(self, done: asyncio.Future[bool], ok: bool) -> None:
        if not done.done():
            done.set_result(ok)
            if ok:
                self.snapshots_sent += 1
            else:
                self.snapshots_failed += 1

    def _ack_arrived(self, link: Link, transfer: int, ok: bool) -> None:
        done = link.outgoing.pop(transfer, None)
        if done is not None:
            self._settle(done, ok)

    # ---- receiving ---------------------------------------------------------------------

    def _chunk_arrived(self, peer: PeerState, link: Link, chunk: Chunk) -> None:
        try:
            whole = link.receiving.take(chunk)
        except OSError as e:
            log.warning("snapshot of shard %d from %s discarded: %s", chunk.shard, peer.id, e)
            self.snapshots_discarded += 1
            self._write(link, KIND_ACK, encode_ack(chunk.transfer, False))
            return
        if whole is not None:
            self._spawn(self._snapshot_arrived(peer, link, chunk.transfer, whole))

    def _abort_arrived(self, link: Link, transfer: int) -> None:
        if transfer in link.receiving.transfers:
            self.snapshots_discarded += 1
        link.receiving.discard(transfer)
        link.receiving.refused.discard(transfer)

    async def _snapshot_arrived(self, peer: PeerState, link: Link, transfer: int,
                                inc: snapxfer.Incoming) -> None:
        try:
            path = await asyncio.to_thread(snapxfer.make_durable, inc)
        except OSError as e:
            log.warning("snapshot of shard %d from %s discarded: %s", inc.shard, peer.id, e)
            self.snapshots_discarded += 1
            if not link.closed:
                self._write(link, KIND_ACK, encode_ack(transfer, False))
            return
        self.snapshots_received += 1
        try:
            self.on_snapshot(peer.id, inc.shard, inc.message, path)
            ok = True
        except Exception:
            # The host could not take it: say so, and the leader probes this node again
            # rather than waiting on a snapshot that was never installed.
            log.exception("the host failed on a snapshot from %s", peer.id)
            ok = False
        # Whole and durable: the file is the host's now, whatever the connection does.
        if not link.closed:
            self._write(link, KIND_ACK, encode_ack(transfer, ok))
