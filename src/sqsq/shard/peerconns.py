"""The connection half of ``PeerTransport``: listening, dialing, proving each side with the
cluster secret, and settling on one connection per node pair.

A mixin so that ``sqsq.shard.peers`` stays about what travels on the connections (the send
queues, framing and dispatch); it uses the transport's peers, counters and task set.

Either node may dial; a second connection between the same two (both dialed at once) is
retired by a rule both ends apply alike: keep the one the smaller node id dialed. A node that
restarted announces a new incarnation, and the connections to its previous one are dropped at
once (a crashed machine's half-open connection would otherwise be kept over the new one).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqsq.listen import bind_listener
from sqsq.shard import snapxfer
from sqsq.shard.peerauth import (
    HANDSHAKE_TIMEOUT_S,
    AuthError,
    FrameTooLarge,
    Hello,
    accept_frames,
    dial_frames,
)
from sqsq.shard.peerlink import Link, PeerState
from sqsq.shard.peersnap import CONNECT_TIMEOUT_S

log = logging.getLogger("sqsq.peers")

MAX_PENDING_HANDSHAKES = 64
MAX_INCOMING_TRANSFERS = 8  # per connection
MAX_SNAPSHOT_BYTES = 1 << 40


class Connections:
    """What the transport provides (``sqsq.shard.peers.PeerTransport``)."""

    node_id: str
    host: str
    port: int
    snapshot_dir: Path
    max_frame_bytes: int
    backoff_s: tuple[float, float]
    on_refused: Callable[[str], None] | None
    incarnation: bytes
    _secret: bytes
    _peers: dict[str, PeerState]
    _server: asyncio.Server | None
    _tasks: set[asyncio.Task]
    _handshakes: int
    _stopped: bool
    connects: int
    reconnects: int
    connect_failures: int
    auth_failures: int
    oversized_frames: int
    snapshots_discarded: int

    if TYPE_CHECKING:  # declared only: the real ones come later in the class's MRO
        def _frame_arrived(self, peer: PeerState, link: Link, kind: int,
                           payload: memoryview) -> None: ...
        def _link_failed(self, peer: PeerState, link: Link, e: Exception) -> None: ...
        def _flush_soon(self, peer: PeerState) -> None: ...
        def _settle(self, done: asyncio.Future[bool], ok: bool) -> None: ...

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
            peer.clear_queue()
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
                    if isinstance(e, ConnectionRefusedError) and self.on_refused is not None:
                        self.on_refused(peer.id)  # nothing listens there: the process is gone
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
            self._flush_soon(peer)

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
        if peer.queue or not peer.links:
            # Dialed at once even with nothing to send: a refusal is how a follower learns
            # that its leader's process died (``on_refused``), long before a timeout would.
            self._dial_soon(peer)
