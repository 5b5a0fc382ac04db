"""One transport per node pair: every shard's Raft messages between two node processes
travel over one authenticated TCP connection, on the node's event loop.

pysyncobj gave every shard replica its own port, poller and connections, so a node with 32
shards kept 64 connections and sent 32 heartbeats per tick to each peer. Here a node has one
connection per peer, and what the node's shards send a peer during one event-loop turn goes
out as one frame: heartbeats of many shards coalesce into one write.

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

Either node may dial; a second connection between the same two (both dialed at once) is
retired by a rule both ends apply alike: keep the one the smaller node id dialed. A node that
restarted announces a new incarnation, and the connections to its previous one are dropped at
once (a crashed machine's half-open connection would otherwise be kept over the new one).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from sqsq.listen import bind_listener
from sqsq.raft.types import Message
from sqsq.shard import snapxfer
from sqsq.shard.peerauth import (
    HANDSHAKE_TIMEOUT_S,
    INCARNATION_BYTES,
    AuthError,
    FrameTooLarge,
    Hello,
    accept_frames,
    dial_frames,
)
from sqsq.shard.peerlink import (
    KIND_ABORT,
    KIND_ACK,
    KIND_CHUNK,
    KIND_MESSAGES,
    KIND_WRITE_SETS,
    Link,
    PeerState,
    frame,
    message_size,
)
from sqsq.shard.peersnap import CONNECT_TIMEOUT_S, SnapshotTransfers
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
MAX_PENDING_HANDSHAKES = 64
MAX_INCOMING_TRANSFERS = 8  # per connection
MAX_SNAPSHOT_BYTES = 1 << 40
# How long a leader's write sets wait for messages to the same peer to ride with.
WRITE_SETS_LINGER_S = 0.005
BACKOFF_S = (0.05, 2.0)  # the first retry's wait, doubled per failure up to the second


class PeerTransport(SnapshotTransfers):
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
                 on_write_sets: OnWriteSets | None = None) -> None:
        """``node_id``: this node's name among its peers (each proves it with ``secret``).
        ``on_messages(peer, [(shard, message), ...])`` gets each batch as it arrives;
        ``on_snapshot(peer, shard, message, path)`` each snapshot file once whole and
        durable in ``snapshot_dir`` (the transport's own directory: unfinished transfers
        found there at start are removed; finished ones are the host's to move or delete);
        ``on_write_sets(peer, [(shard, index, term, check, packed), ...])`` a leader's write
        sets."""
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
        self.on_write_sets = on_write_sets
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
        # counters
        self.frames_sent = self.frames_received = 0
        self.bytes_sent = self.bytes_received = 0
        self.messages_sent = self.messages_received = self.messages_dropped = 0
        self.connects = self.reconnects = self.connect_failures = 0
        self.auth_failures = self.oversized_frames = self.bad_frames = 0
        self.unknown_frames = 0
        self.snapshots_sent = self.snapshots_failed = 0
        self.snapshots_received = self.snapshots_discarded = 0

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> int:
        """Listen on ``host`` only (its first address; port 0: any free one); the port."""
        self.snapshot_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.snapshot_dir.glob("*" + snapxfer.PART_SUFFIX):
            stale.unlink()  # a transfer cut short by our own crash
        sock = await bind_listener(self.host, self.port, "Raft peers")
        self._server = await asyncio.get_running_loop().create_server(
            lambda: self._link(dialed=False), sock=sock)
        self.port = sock.getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Close the listener and every connection; transfers in flight fail."""
        self._stopped = True
        if self._server is not None:
            self._server.close()
        for peer in self._peers.values():
            for link in list(peer.links.values()):
                self._drop(peer, link)
            peer.queue.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def forget(self, peer_id: str) -> None:
        """``peer_id`` left the cluster: close its connections, stop dialing it."""
        peer = self._peers.pop(peer_id, None)
        if peer is not None:
            peer.forgotten = True
            for link in list(peer.links.values()):
                self._drop(peer, link)
            if peer.dialer is not None:
                peer.dialer.cancel()

    def connections(self) -> dict[str, int]:
        """Peer id -> connections in use with it (one, once both ends settled)."""
        return {p.id: len(p.links) for p in self._peers.values() if p.links}

    # ---- sending -----------------------------------------------------------------------

    def send(self, peer_id: str, address: tuple[str, int], shard_id: int,
             message: Message) -> None:
        """Queue ``message`` for ``peer_id`` (at ``address``); it leaves with everything
        else queued for that peer this loop turn, in one frame."""
        if self._stopped:
            self.messages_dropped += 1
            return
        peer = self._peer(peer_id, address)
        size = message_size(message)
        if size > self.max_queue_bytes:
            self.messages_dropped += 1
            return
        peer.queue.append((shard_id, message, size))
        peer.queued_bytes += size
        while len(peer.queue) > self.max_queue_messages or \
                peer.queued_bytes > self.max_queue_bytes:
            peer.queued_bytes -= peer.queue.popleft()[2]
            self.messages_dropped += 1
        if not peer.flush_scheduled:
            peer.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush, peer)

    def send_write_sets(self, peer_id: str, address: tuple[str, int], shard_id: int,
                        sets: list[tuple[int, int, int, bytes | None]]) -> None:
        """Queue a leader's write sets (index, term, entry checksum, packed) for ``peer_id``;
        they go ahead of the next messages to it. Only to a connected peer, and bounded like
        the queue: a write set is only ever a saving, its loss costs the follower an apply."""
        peer = self._peer(peer_id, address)
        if self._stopped or peer.active() is None or \
                peer.write_set_bytes > self.max_queue_bytes:
            return
        for index, term, entry_check, blob in sets:
            peer.write_sets.append((shard_id, index, term, entry_check, blob))
            peer.write_set_bytes += 0 if blob is None else len(blob)
        if not peer.write_sets_due:
            # They ride with the next messages to this peer (one system call for both,
            # which on loopback is most of a send's cost), or leave on their own shortly.
            peer.write_sets_due = True
            asyncio.get_running_loop().call_later(WRITE_SETS_LINGER_S, self._flush_write_sets,
                                                  peer)

    def flush_now(self) -> None:
        """Write what is queued for every peer now instead of at the end of the loop's
        turn: before the loop blocks on the disk (an fsync on the loop), what was sent must
        already be on its way."""
        for peer in self._peers.values():
            if peer.flush_scheduled:
                self._flush(peer)

    def _flush_write_sets(self, peer: PeerState) -> None:
        peer.write_sets_due = False
        if peer.write_sets and not peer.flush_scheduled:
            self._flush(peer)

    def _flush(self, peer: PeerState) -> None:
        peer.flush_scheduled = False
        link = peer.active()
        ahead = b""
        if peer.write_sets:
            if link is not None:
                ahead = frame(KIND_WRITE_SETS, encode_write_sets(peer.write_sets))
                self.frames_sent += 1
            peer.write_sets, peer.write_set_bytes = [], 0
        if not peer.queue:
            if link is not None and ahead:
                self.bytes_sent += link.write_bytes(ahead)
            return
        if link is None:
            self._dial_soon(peer)  # the queue waits (bounded) for the connection
            return
        if link.buffered() > self.max_write_buffer_bytes:
            self.messages_dropped += len(peer.queue)  # it does not read: do not buffer more
            peer.clear_queue()
            return
        batch = [(shard, m) for shard, m, _ in peer.queue]
        peer.clear_queue()
        self._write(link, KIND_MESSAGES, encode_messages(batch), ahead)
        self.messages_sent += len(batch)

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

    def _write(self, link: Link, kind: int, payload: bytes, ahead: bytes = b"") -> None:
        self.bytes_sent += link.write(kind, payload, ahead)
        self.frames_sent += 1

    # ---- connections -------------------------------------------------------------------

    def _peer(self, peer_id: str, address: tuple[str, int] | None) -> PeerState:
        peer = self._peers.get(peer_id)
        if peer is None:
            peer = self._peers[peer_id] = PeerState(peer_id)
        if address is not None:
            peer.address = address
        return peer

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _dial_soon(self, peer: PeerState) -> None:
        if peer.active() is None and peer.dialer is None and peer.address is not None \
                and not self._stopped and not peer.forgotten:
            peer.dialer = self._spawn(self._dial(peer))

    async def _dial(self, peer: PeerState) -> None:
        """Connect to ``peer`` until connected (or it connected to us), waiting longer after
        each failure; one log line when it becomes unreachable, not one per attempt."""
        delay = self.backoff_s[0]
        try:
            while peer.active() is None and not self._stopped and peer.address is not None:
                host, port = peer.address
                link: Link | None = None
                try:
                    _, link = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                        lambda: self._link(dialed=True), host, port), CONNECT_TIMEOUT_S)
                    hello = await asyncio.wait_for(dial_frames(
                        link.handshake_frame, link.send_raw, secret=self._secret,
                        node_id=self.node_id, incarnation=self.incarnation, expect=peer.id),
                        HANDSHAKE_TIMEOUT_S)
                except (OSError, TimeoutError, ValueError, AuthError) as e:
                    if link is not None:
                        link.abort()
                    self.connect_failures += 1
                    if isinstance(e, AuthError):
                        self.auth_failures += 1
                    if peer.reachable:
                        peer.reachable = False
                        log.warning("cannot reach Raft peer %s at %s:%d: %s", peer.id, host,
                                    port, e or type(e).__name__)
                    await asyncio.sleep(delay)  # back off: a down peer is not hammered
                    delay = min(delay * 2, self.backoff_s[1])
                    continue
                except asyncio.CancelledError:
                    if link is not None:
                        link.abort()  # stopped mid-handshake
                    raise
                if self._stopped or peer.forgotten:
                    link.abort()
                    return
                self._attach(peer, hello, link)
        finally:
            peer.dialer = None

    def _link(self, *, dialed: bool) -> Link:
        return Link(dialed=dialed, max_frame_bytes=self.max_frame_bytes,
                    receiving=snapxfer.Receiving(self.snapshot_dir, MAX_INCOMING_TRANSFERS,
                                                 MAX_SNAPSHOT_BYTES),
                    on_made=None if dialed else self._accepted)

    def _accepted(self, link: Link) -> None:
        """A connection came in (its protocol just got its socket): authenticate it."""
        if self._stopped or self._handshakes >= MAX_PENDING_HANDSHAKES:
            link.abort()
            return
        self._handshakes += 1
        self._spawn(self._authenticate(link))

    async def _authenticate(self, link: Link) -> None:
        who = link.address()
        try:
            hello = await asyncio.wait_for(accept_frames(
                link.handshake_frame, link.send_raw, secret=self._secret,
                node_id=self.node_id, incarnation=self.incarnation), HANDSHAKE_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError, AuthError) as e:
            link.abort()
            if isinstance(e, AuthError):
                self.auth_failures += 1
            elif isinstance(e, FrameTooLarge):
                self.oversized_frames += 1
            log.warning("Raft peer connection from %s refused: %s", who,
                        e or type(e).__name__)
            return
        except asyncio.CancelledError:
            link.abort()  # stopped mid-handshake
            raise
        finally:
            self._handshakes -= 1
        if self._stopped:
            link.abort()
            return
        self._attach(self._peer(hello.peer_id, None), hello, link)

    def _attach(self, peer: PeerState, hello: Hello, link: Link) -> None:
        dialed = link.dialed
        link.start(hello.peer_id, hello.incarnation,
                   functools.partial(self._frame_arrived, peer, link),
                   functools.partial(self._link_failed, peer, link),
                   functools.partial(self._drop, peer, link))
        if link.gone:
            return  # lost between its handshake and now (start dropped it)
        # A different incarnation: the peer restarted, the old connection is dead whatever
        # TCP says. (The new link goes in first, so dropping the old one dials nothing.)
        stale = [old for old in peer.links.values()
                 if old.dialed == dialed or old.incarnation != hello.incarnation]
        peer.links[dialed] = link
        for old in stale:
            self._drop(peer, old)
        self.connects += 1
        if len(peer.links) == 2:
            # Both dialed at once. Both ends keep the one the smaller id dialed, so they
            # agree without a word; the other is retired: no more sends on it, and it is
            # half-closed so what is in flight on it still arrives.
            retired = peer.links.pop(self.node_id > peer.id)
            retired.retire()
            if retired is link:
                return
        if peer.ever_connected:
            self.reconnects += 1
        peer.ever_connected = peer.reachable = True
        peer.connected.set()
        if peer.queue and not peer.flush_scheduled:
            peer.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush, peer)

    def _drop(self, peer: PeerState, link: Link) -> None:
        """``link`` is gone (or going): no more sends on it, its transfers failed or
        discarded, and if the peer has messages waiting, it is dialed again."""
        link.abort()
        if peer.links.get(link.dialed) is link:
            del peer.links[link.dialed]
        if not peer.links:
            peer.connected.clear()
        for done in link.outgoing.values():
            self._settle(done, False)
        link.outgoing.clear()
        self.snapshots_discarded += link.receiving.discard_all()
        if peer.queue:
            self._dial_soon(peer)

    # ---- receiving ---------------------------------------------------------------------

    def _frame_arrived(self, peer: PeerState, link: Link, kind: int,
                       payload: memoryview) -> None:
        """One whole frame from ``link``, handed on in the socket's own callback."""
        self.heard[peer.id] = time.monotonic()
        self.frames_received += 1
        self.bytes_received += 5 + len(payload)
        try:
            self._dispatch(peer, link, kind, payload)
        except ValueError as e:
            self._link_failed(peer, link, e)

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
        if kind == KIND_MESSAGES:
            batch = decode_messages(payload)
            self.messages_received += len(batch)
            try:
                self.on_messages(peer.id, batch)
            except Exception:
                log.exception("the host failed on messages from %s", peer.id)
        elif kind == KIND_CHUNK:
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
