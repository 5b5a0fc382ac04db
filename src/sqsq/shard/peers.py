"""One transport per node pair: every shard's Raft messages between two node processes
travel over one authenticated TCP connection, on the node's event loop.

pysyncobj gave every shard replica its own port, poller and connections, so a node with 32
shards kept 64 connections and sent 32 heartbeats per tick to each peer. Here a node has one
connection per peer, and what the node's shards send a peer during one event-loop turn goes
out as one frame: heartbeats of many shards coalesce into one write, and one callback at the
turn's end writes to every peer that has something queued.

Frames are ``[u32 length][u8 kind][payload]`` (``sqsq.shard.raftwire`` for the payloads):
a batch of (shard, message) pairs, a snapshot chunk, a snapshot acknowledgement or abort, a
leader's write sets (``sqsq.shard.writesets``). A frame of a kind this node does not know (a
newer node's) is skipped. A connection is read by its socket's protocol
(``sqsq.shard.peerlink.Link``): each read lands in the link's buffer and its whole frames go
to the host in that read's own callback, with no reader task between.
Everything is bounded: a frame's size (a larger length prefix closes the connection before
any of it is read), the queue per peer (count and bytes; when full the oldest messages go:
Raft tolerates loss, and after an outage the newest are the ones worth delivering), what a
slow peer may leave in our socket buffer, what a peer may send before it is proven (a
read buffer's worth), the transfers in progress. ``send`` never blocks
and never raises for the network's sake.

How connections are made, proven and settled (one per pair) is ``sqsq.shard.peerconns``;
snapshot transfers are ``sqsq.shard.peersnap``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from sqsq.raft.types import Message
from sqsq.shard.peerauth import INCARNATION_BYTES, FrameTooLarge
from sqsq.shard.peerconns import Connections
from sqsq.shard.peerlink import (
    KIND_ABORT,
    KIND_ACK,
    KIND_CHUNK,
    KIND_MESSAGES,
    KIND_WRITE_SETS,
    Link,
    PeerState,
    frame_header,
    message_size,
)
from sqsq.shard.peersnap import SnapshotTransfers
from sqsq.shard.raftwire import (
    decode_ack,
    decode_chunk,
    decode_messages,
    decode_write_sets,
    encode_messages,
    encode_write_sets,
)

log = logging.getLogger("sqsq.peers")

OnMessages = Callable[[str, list[tuple[int, Message]]], None]
OnSnapshot = Callable[[str, int, Message, Path], None]
OnWriteSets = Callable[[str, list[tuple[int, int, int, int, bytes | None]]], None]

_EMPTY_BATCH = encode_messages([])
MAX_FRAME_BYTES = 64 << 20
SNAPSHOT_CHUNK_BYTES = 1 << 20
MAX_QUEUE_MESSAGES = 8192
MAX_QUEUE_BYTES = 16 << 20  # well under a frame: one turn's queue always fits in one
MAX_WRITE_BUFFER_BYTES = 32 << 20  # past this, a peer that does not read loses batches
# How long a leader's write sets wait for messages to the same peer to ride with.
WRITE_SETS_LINGER_S = 0.005
BACKOFF_S = (0.05, 2.0)  # the first retry's wait, doubled per failure up to the second


class PeerTransport(Connections, SnapshotTransfers):
    """The node's Raft peer transport. Counters (plain ints) say what it did; the host
    exports them. Everything is called on the node's event loop (it keeps no lock)."""

    def __init__(self, node_id: str, host: str, port: int, secret: bytes,
                 on_messages: OnMessages, on_snapshot: OnSnapshot, *, snapshot_dir: Path,
                 max_queue_messages: int = MAX_QUEUE_MESSAGES,
                 max_queue_bytes: int = MAX_QUEUE_BYTES,
                 max_frame_bytes: int = MAX_FRAME_BYTES,
                 chunk_bytes: int = SNAPSHOT_CHUNK_BYTES,
                 max_write_buffer_bytes: int = MAX_WRITE_BUFFER_BYTES,
                 backoff_s: tuple[float, float] = BACKOFF_S,
                 on_write_sets: OnWriteSets | None = None,
                 on_refused: Callable[[str], None] | None = None) -> None:
        """``node_id``: this node's name among its peers (each proves it with ``secret``).
        ``on_messages(peer, [(shard, message), ...])`` gets each batch as it arrives;
        ``on_snapshot(peer, shard, message, path)`` each snapshot file once whole and
        durable in ``snapshot_dir`` (the transport's own directory: unfinished transfers
        found there at start are removed; finished ones are the host's to move or delete);
        ``on_write_sets(peer, [(shard, index, term, check, packed), ...])`` a leader's write
        sets; ``on_refused(peer)`` each refused dial (nothing listens at its address)."""
        if not host:
            # An empty host would listen on every interface; say so explicitly if meant.
            raise ValueError("the Raft transport needs the address to listen on")
        if not secret:
            raise ValueError("the Raft transport needs the cluster secret")
        if max_queue_bytes * 2 > max_frame_bytes or chunk_bytes * 2 > max_frame_bytes:
            raise ValueError("a peer's queue and a snapshot chunk must fit in a frame")
        self.node_id, self.host, self.port = node_id, host, port
        self._secret = secret
        self.on_messages, self.on_snapshot = on_messages, on_snapshot
        self.on_write_sets, self.on_refused = on_write_sets, on_refused
        self.snapshot_dir = snapshot_dir
        self.max_queue_messages, self.max_queue_bytes = max_queue_messages, max_queue_bytes
        self.max_frame_bytes, self.chunk_bytes = max_frame_bytes, chunk_bytes
        self.max_write_buffer_bytes = max_write_buffer_bytes
        self.backoff_s = backoff_s
        self.incarnation = os.urandom(INCARNATION_BYTES)
        self._peers: dict[str, PeerState] = {}
        self.heard: dict[str, float] = {}  # peer id -> when its last frame came (monotonic)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._handshakes = 0
        self._transfer_ids = itertools.count(1)
        self._stopped = False
        # Peers with something to write at the end of this loop turn; one callback (set
        # when the first is added) writes to them all.
        self._due: list[PeerState] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        # counters
        self.frames_sent = self.frames_received = 0
        self.bytes_sent = self.bytes_received = 0
        self.messages_sent = self.messages_received = self.messages_dropped = 0
        self.connects = self.reconnects = self.connect_failures = 0
        self.auth_failures = self.oversized_frames = self.bad_frames = 0
        self.unknown_frames = 0
        self.snapshots_sent = self.snapshots_failed = 0
        self.snapshots_received = self.snapshots_discarded = 0

    # ---- sending -----------------------------------------------------------------------

    def send(self, peer_id: str, address: tuple[str, int], shard_id: int,
             message: Message) -> None:
        """Queue ``message`` for ``peer_id`` (at ``address``); it leaves with everything
        else queued for that peer this loop turn, in one frame."""
        peer = self._peers.get(peer_id)
        if peer is None or self._stopped:
            if self._stopped:
                self.messages_dropped += 1
                return
            peer = self._peer(peer_id, address)
        else:
            peer.address = address
        size = message_size(message)
        if size > self.max_queue_bytes:
            self.messages_dropped += 1
            return
        queue = peer.queue
        queue.append((shard_id, message))
        peer.queued_bytes += size
        if len(queue) > self.max_queue_messages or peer.queued_bytes > self.max_queue_bytes:
            self._overflow(peer)
        if not peer.flush_scheduled:
            self._flush_soon(peer)

    def _overflow(self, peer: PeerState) -> None:
        """The oldest messages go (their sizes worked out again: this is the rare path)."""
        queue = peer.queue
        while len(queue) > self.max_queue_messages or peer.queued_bytes > self.max_queue_bytes:
            peer.queued_bytes -= message_size(queue.popleft()[1])
            self.messages_dropped += 1

    def send_write_sets(self, peer_id: str, address: tuple[str, int], shard_id: int,
                        sets: list[tuple[int, int, int, bytes | None]]) -> None:
        """Queue a leader's write sets (index, term, entry checksum, packed) for ``peer_id``;
        they go ahead of the next messages to it. Only to a connected peer, and bounded like
        the queue: a write set is only ever a saving, its loss costs the follower an apply."""
        peer = self._peer(peer_id, address)
        if self._stopped or peer.active() is None or \
                peer.write_set_bytes > self.max_queue_bytes:
            return
        loop = self._event_loop()
        if not peer.write_sets:
            peer.write_sets_since = loop.time()
        for index, term, entry_check, blob in sets:
            peer.write_sets.append((shard_id, index, term, entry_check, blob))
            peer.write_set_bytes += 0 if blob is None else len(blob)
        if not peer.write_sets_due:
            # They ride with the next messages to this peer (one system call for both,
            # which on loopback is most of a send's cost), or leave on their own shortly.
            peer.write_sets_due = True
            loop.call_later(WRITE_SETS_LINGER_S, self._flush_write_sets, peer)

    def flush_now(self) -> None:
        """Write what is queued for every peer now instead of at the end of the loop's
        turn: before the loop blocks on the disk (an fsync on the loop), what was sent must
        already be on its way."""
        for peer in self._due:
            if peer.flush_scheduled:
                self._flush(peer)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _flush_soon(self, peer: PeerState) -> None:
        peer.flush_scheduled = True
        self._due.append(peer)
        if len(self._due) == 1:
            self._event_loop().call_soon(self._flush_due)

    def _flush_due(self) -> None:
        due, self._due = self._due, []
        for peer in due:
            if peer.flush_scheduled:  # not written already (``flush_now``)
                try:
                    self._flush(peer)
                except Exception:  # one peer's failure must not hold up the others
                    log.exception("writing to Raft peer %s failed", peer.id)

    def _flush_write_sets(self, peer: PeerState) -> None:
        """The linger's end: the write sets that waited that long leave on their own. Those
        queued since others rode with a message wait out their own linger (one timer per
        linger, not per write set: under a steady stream of sends, a timer set for sets long
        gone used to send the newest alone, a system call and a wake-up of the follower
        that the next append, a fraction of a millisecond later, would have carried them
        in)."""
        peer.write_sets_due = False
        if not peer.write_sets or peer.flush_scheduled:
            return
        loop = self._event_loop()
        wait = peer.write_sets_since + WRITE_SETS_LINGER_S - loop.time()
        if wait > 0:
            peer.write_sets_due = True
            loop.call_later(wait, self._flush_write_sets, peer)
            return
        self._flush(peer)

    def _flush(self, peer: PeerState) -> None:
        peer.flush_scheduled = False
        link = peer.active()
        ahead: list[bytes] | None = None
        if peer.write_sets:
            if link is not None:
                sets = encode_write_sets(peer.write_sets)
                ahead = [frame_header(KIND_WRITE_SETS, len(sets)), sets]
                self.frames_sent += 1
            peer.write_sets, peer.write_set_bytes = [], 0
        queue = peer.queue
        if not queue:
            if ahead is not None:
                self.bytes_sent += link.write_parts(ahead)  # type: ignore[union-attr]
            return
        if link is None:
            self._dial_soon(peer)  # the queue waits (bounded) for the connection
            return
        if link.buffered() > self.max_write_buffer_bytes:
            self.messages_dropped += len(queue)  # it does not read: do not buffer more
            peer.clear_queue()
            return
        payload = encode_messages(queue)
        self.messages_sent += len(queue)
        peer.clear_queue()
        self._write(link, KIND_MESSAGES, payload, ahead)

    def linked(self, peer_id: str) -> bool:
        """Whether a connection with ``peer_id`` is open now (a node that stopped closed
        its own, and refuses the next)."""
        peer = self._peers.get(peer_id)
        return peer is not None and peer.active() is not None

    def ping(self, peer_id: str, address: tuple[str, int]) -> None:
        """Send ``peer_id`` an empty batch (dialing if need be): the node's own heartbeat,
        one per pair of nodes whatever their shards do, so that the quiet groups' followers
        can tell an idle leader's node from a dead one (``heard``)."""
        if self._stopped:
            return
        peer = self._peer(peer_id, address)
        link = peer.active()
        if link is None:
            self._dial_soon(peer)
        elif not peer.queue and link.buffered() <= self.max_write_buffer_bytes:
            self._write(link, KIND_MESSAGES, _EMPTY_BATCH)

    def _write(self, link: Link, kind: int, payload: bytes,
               ahead: list[bytes] | None = None) -> None:
        self.bytes_sent += link.write(kind, payload, ahead)
        self.frames_sent += 1

    # ---- receiving ---------------------------------------------------------------------

    def _frame_arrived(self, peer: PeerState, link: Link, kind: int,
                       payload: memoryview) -> None:
        """One whole frame from ``link``, handed on in the socket's own callback."""
        self.heard[peer.id] = time.monotonic()
        self.frames_received += 1
        self.bytes_received += 5 + len(payload)
        if kind != KIND_MESSAGES:
            try:
                self._dispatch(peer, link, kind, payload)
            except ValueError as e:
                self._link_failed(peer, link, e)
            return
        try:
            batch = decode_messages(payload)
        except ValueError as e:
            self._link_failed(peer, link, e)
            return
        self.messages_received += len(batch)
        try:
            self.on_messages(peer.id, batch)
        except Exception:
            log.exception("the host failed on messages from %s", peer.id)

    def _link_failed(self, peer: PeerState, link: Link, e: Exception) -> None:
        """``link`` sent what it must not (a frame too large, one we cannot decode): it is
        cut off."""
        if isinstance(e, FrameTooLarge):
            self.oversized_frames += 1
        else:
            self.bad_frames += 1
        log.warning("Raft peer %s cut off: %s", peer.id, e)
        self._drop(peer, link)

    def _dispatch(self, peer: PeerState, link: Link, kind: int, payload: memoryview) -> None:
        """A frame other than a batch of messages."""
        if kind == KIND_CHUNK:
            self._chunk_arrived(peer, link, decode_chunk(payload))
        elif kind == KIND_ACK:
            self._ack_arrived(link, *decode_ack(payload))
        elif kind == KIND_ABORT:
            self._abort_arrived(link, decode_ack(payload)[0])
        elif kind == KIND_WRITE_SETS:
            sets = decode_write_sets(payload)
            if self.on_write_sets is not None:
                try:
                    self.on_write_sets(peer.id, sets)
                except Exception:
                    log.exception("the host failed on write sets from %s", peer.id)
        else:
            # A newer peer's kind: skipped, so that adding one never splits a cluster that is
            # being upgraded one node at a time.
            self.unknown_frames += 1
