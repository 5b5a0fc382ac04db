"""A small asyncio etcd v3 client: reads, writes, leases and revision-guarded transactions.

It speaks etcd's gRPC API through the generated stubs that the ``aetcd`` package ships
(they load under our protobuf 7). ``aetcd.Client`` itself is not used: its transaction call
drops the response header (so a writer cannot learn the revision it wrote at) and its watch
iterator raises on an etcd restart without resubscribing. ``sqsq.control.watch`` and
``sqsq.control.lease`` build the watch, keepalive and election on top of this module.

Every call has a bounded deadline. A call waits (up to ``retry_for_s``) for the channel to
connect, so a write made while etcd restarts goes out once etcd is back. After a request was
sent, only reads and plain puts/deletes are retried on a transport error; a guarded
transaction whose outcome is unknown raises ``EtcdOutcomeUnknown`` (the CAS helpers resolve
that by reading the key back).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from aetcd import rpc
from aetcd.rpc import rpc_pb2

log = logging.getLogger(__name__)

# Reconnect quickly after an etcd restart (gRPC's default backoff grows to 120 s), and ping
# an idle stream so a frozen etcd is noticed. etcd refuses pings more often than every 5 s.
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
)

TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# Once a call has found etcd unreachable, the next ones (those on the default budget) wait
# for it this long only, until one gets through: a CreateQueue during an outage is refused
# in seconds, not after two whole budgets each (and a client that retries a 503, boto3 five
# times, is not held for minutes). The channel redials every second at most, so a call made
# once etcd is back still finds it.
DOWN_WAIT_S = 2.0


class EtcdError(Exception):
    """etcd refused a request, or could not be reached in time."""


class EtcdUnavailable(EtcdError):
    """etcd could not be reached within the retry deadline; nothing was written."""


class EtcdOutcomeUnknown(EtcdError):
    """A write was sent but its answer was lost: it may or may not have been applied."""


class LeaseNotFound(EtcdError):
    """The lease expired or was revoked."""


class CasConflict(EtcdError):
    """A compare-and-swap lost: the key was not at the revision the caller read."""

    def __init__(self, key: str, expected_mod_revision: int, current: KeyValue | None):
        self.key = key
        self.expected_mod_revision = expected_mod_revision
        self.current = current
        now = current.mod_revision if current else 0
        super().__init__(f"{key}: expected mod revision {expected_mod_revision}, found {now}")


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_pb(cls, kv: Any) -> KeyValue:
        return cls(kv.key.decode(), kv.value, kv.create_revision, kv.mod_revision,
                   kv.version, kv.lease)


@dataclass(frozen=True)
class RangeResult:
    kvs: tuple[KeyValue, ...]
    revision: int  # the store revision the read saw: watch from revision + 1


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store revision after the transaction (its own if it wrote)
    responses: tuple[Any, ...]  # rpc_pb2.ResponseOp, one per operation of the branch taken


def prefix_range_end(prefix: str) -> bytes:
    """The end of the key range holding every key that starts with ``prefix``."""
    end = bytearray(prefix.encode())
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end[: len(end)])
        end.pop()
    return b"\0"  # every key


# Transaction building blocks: etcd's own messages, built by name rather than operators.

def mod_revision_is(key: str, revision: int) -> Any:
    """True while ``key`` was last written at ``revision`` (0: the key does not exist)."""
    return rpc_pb2.Compare(key=key.encode(), target=rpc_pb2.Compare.MOD,
                           result=rpc_pb2.Compare.EQUAL, mod_revision=revision)


def create_revision_is(key: str, revision: int) -> Any:
    """True while ``key`` is the incarnation created at ``revision`` (0: absent)."""
    return rpc_pb2.Compare(key=key.encode(), target=rpc_pb2.Compare.CREATE,
                           result=rpc_pb2.Compare.EQUAL, create_revision=revision)


def put_op(key: str, value: bytes, lease: int = 0) -> Any:
    return rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(
        key=key.encode(), value=value, lease=lease))


def delete_op(key: str) -> Any:
    return rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=key.encode()))


def get_op(key: str) -> Any:
    return rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=key.encode()))


ROUND_ROBIN = (("grpc.lb_policy_name", "round_robin"),)


def channel_target(endpoint: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """The gRPC target and extra options for etcd at ``host:port``, or for the members of an
    etcd cluster, ``host:port,host:port,...`` (names resolved now): one channel that spreads
    calls round robin over the addresses it is connected to. A member that dies drops out of
    the rotation, a call that failed on it is retried on another (reads and plain writes;
    see ``Etcd.call``), and a watch on it is opened again elsewhere. A single name that
    resolves to several addresses (the members behind one DNS name, as in deploy/) is
    spread over in the same way."""
    hosts = [e.strip() for e in endpoint.split(",") if e.strip()]
    if len(hosts) <= 1:
        return endpoint, ROUND_ROBIN
    addresses = []
    for host_port in hosts:
        host, _, port = host_port.rpartition(":")
        info = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
        family, *_, address = info[0]
        addresses.append((family, f"[{address[0]}]:{port}" if family == socket.AF_INET6
                          else f"{address[0]}:{port}"))
    scheme = "ipv6" if all(f == socket.AF_INET6 for f, _ in addresses) else "ipv4"
    return f"{scheme}:{','.join(a for _, a in addresses)}", ROUND_ROBIN


class Etcd:
    """One connection to etcd: one endpoint (``host:port``), or a cluster's members
    (``host:port,host:port,...``, see ``channel_target``)."""

    def __init__(self, endpoint: str, *, rpc_timeout_s: float = 5.0,
                 retry_for_s: float = 15.0) -> None:
        self.endpoint = endpoint
        self.rpc_timeout_s = rpc_timeout_s
        self.retry_for_s = retry_for_s
        # A call or a watch gave up on reaching etcd, and no call got through since
        # (``DOWN_WAIT_S``).
        self.unreachable = False
        target, options = channel_target(endpoint)
        self.channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS + options)
        self.kv = rpc.KVStub(self.channel)
        self.leases = rpc.LeaseStub(self.channel)
        self.watches = rpc.WatchStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> Etcd:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the retry core ------------------------------------------------------------------

    async def wait_connected(self, deadline: float) -> None:
        """Wait until the channel is READY, or raise ``EtcdUnavailable`` at ``deadline``."""
        while True:
            state = self.channel.get_state(try_to_connect=True)
            if state == grpc.ChannelConnectivity.READY:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.unreachable = True  # (a watch waiting to resume finds it out too)
                raise EtcdUnavailable(f"etcd at {self.endpoint} unreachable ({state.name})")
            try:
                await asyncio.wait_for(self.channel.wait_for_state_change(state), remaining)
            except TimeoutError:
                pass

    async def call(self, method: Callable[..., Awaitable[Any]], request: Any, *,
                   retry_after_send: bool, retry_for_s: float | None = None) -> Any:
        """One unary RPC with the connection wait and bounded retries described above."""
        if retry_for_s is None:
            retry_for_s = min(self.retry_for_s, DOWN_WAIT_S) if self.unreachable \
                else self.retry_for_s
        try:
            reply = await self._call(method, request, retry_after_send,
                                     time.monotonic() + retry_for_s)
        except EtcdUnavailable:
            self.unreachable = True
            raise
        self.unreachable = False
        return reply

    async def _call(self, method: Callable[..., Awaitable[Any]], request: Any,
                    retry_after_send: bool, deadline: float) -> Any:
        delay_s = 0.05
        while True:
            await self.wait_connected(deadline)
            try:
                timeout_s = max(0.05, min(self.rpc_timeout_s, deadline - time.monotonic()))
                return await method(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in TRANSIENT:
                    raise _translate(exc) from exc
                if not retry_after_send:
                    raise EtcdOutcomeUnknown(
                        f"etcd at {self.endpoint}: {exc.code().name} {exc.details()}"
                    ) from exc
                if time.monotonic() + delay_s >= deadline:
                    raise EtcdUnavailable(
                        f"etcd at {self.endpoint}: {exc.code().name} {exc.details()}"
                    ) from exc
                log.debug("etcd %s: %s, retrying", self.endpoint, exc.code().name)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 1.0)

    # -- keys ----------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        result = await self.range(key)
        return result.kvs[0] if result.kvs else None

    async def range(self, key: str, range_end: bytes = b"", *, revision: int = 0) -> RangeResult:
        req = rpc_pb2.RangeRequest(key=key.encode(), range_end=range_end, revision=revision)
        resp = await self.call(self.kv.Range, req, retry_after_send=True)
        if resp.more:  # a single range read is the snapshot; never page silently
            raise EtcdError(f"range {key!r} was truncated")
        return RangeResult(tuple(KeyValue.from_pb(kv) for kv in resp.kvs), resp.header.revision)

    async def get_prefix(self, prefix: str, *, revision: int = 0) -> RangeResult:
        """Every key under ``prefix``, all read at one revision."""
        return await self.range(prefix, prefix_range_end(prefix), revision=revision)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Unconditional write (retried: writing the same value twice is the same); revision."""
        req = rpc_pb2.PutRequest(key=key.encode(), value=value, lease=lease)
        resp = await self.call(self.kv.Put, req, retry_after_send=True)
        return resp.header.revision

    async def delete(self, key: str) -> int:
        req = rpc_pb2.DeleteRangeRequest(key=key.encode())
        resp = await self.call(self.kv.DeleteRange, req, retry_after_send=True)
        return resp.header.revision

    async def txn(self, compare: Sequence[Any], success: Sequence[Any] = (),
                  failure: Sequence[Any] = ()) -> TxnResult:
        """An atomic compare-then-branch; not retried once sent (see the module doc)."""
        req = rpc_pb2.TxnRequest(compare=list(compare), success=list(success),
                                 failure=list(failure))
        resp = await self.call(self.kv.Txn, req, retry_after_send=False)
        return TxnResult(resp.succeeded, resp.header.revision, tuple(resp.responses))

    # -- compare-and-swap ----------------------------------------------------------------

    async def compare_and_put(self, key: str, value: bytes, mod_revision: int, *,
                              lease: int = 0) -> int:
        """Write ``key`` only if it is still at ``mod_revision`` (0: only if absent).

        Returns the new mod revision; raises ``CasConflict`` with what the key holds now.
        """
        try:
            result = await self.txn([mod_revision_is(key, mod_revision)],
                                    [put_op(key, value, lease)], [get_op(key)])
        except EtcdOutcomeUnknown:
            # The answer was lost. If the key now holds exactly our value and lease at a
            # later revision, our write is the one that landed (or an identical one did).
            current = await self.get(key)
            if (current is not None and current.value == value and current.lease == lease
                    and current.mod_revision > mod_revision):
                return current.mod_revision
            raise
        if not result.succeeded:
            raise CasConflict(key, mod_revision, _first_kv(result))
        return result.revision

    async def compare_and_delete(self, key: str, mod_revision: int) -> int:
        """Delete ``key`` only if it is still at ``mod_revision``; ``CasConflict`` if not."""
        try:
            result = await self.txn([mod_revision_is(key, mod_revision)],
                                    [delete_op(key)], [get_op(key)])
        except EtcdOutcomeUnknown:
            if await self.get(key) is None:
                return 0
            raise
        if not result.succeeded:
            raise CasConflict(key, mod_revision, _first_kv(result))
        return result.revision

    async def update(self, key: str, change: Callable[[KeyValue | None], bytes | None], *,
                     attempts: int = 8, lease: int = 0) -> int:
        """Read, ``change`` (pure: it may run again), write guarded on what was read.

        ``change`` returns the new value, or None to leave the key as it is. Retries a lost
        race up to ``attempts`` times, then raises the last ``CasConflict``.
        """
        conflict: CasConflict | None = None
        for _ in range(attempts):
            current = await self.get(key)
            new = change(current)
            if new is None:
                return current.mod_revision if current else 0
            try:
                return await self.compare_and_put(
                    key, new, current.mod_revision if current else 0, lease=lease)
            except CasConflict as exc:
                conflict = exc
        assert conflict is not None
        raise conflict

    # -- leases (kept alive by sqsq.control.lease.Lease) ---------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        """A new lease id. Retried: a grant whose answer was lost only leaves an orphan
        lease that expires by itself."""
        resp = await self.call(self.leases.LeaseGrant, rpc_pb2.LeaseGrantRequest(TTL=ttl_s),
                               retry_after_send=True)
        if resp.error:
            raise EtcdError(f"lease grant: {resp.error}")
        return resp.ID

    async def keepalive_once(self, lease_id: int, *, within_s: float) -> int:
        """Refresh ``lease_id`` once, giving up after ``within_s``; its TTL in seconds, 0 if
        it no longer exists."""
        async def one(request: Any, timeout: float) -> Any:
            stream = self.leases.LeaseKeepAlive(iter([request]), timeout=timeout)
            async for reply in stream:
                return reply
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                       grpc.aio.Metadata(), "keepalive stream closed")

        reply = await self.call(one, rpc_pb2.LeaseKeepAliveRequest(ID=lease_id),
                                retry_after_send=True, retry_for_s=within_s)
        return max(0, reply.TTL)

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke (deleting every key attached); a lease already gone is not an error."""
        try:
            await self.call(self.leases.LeaseRevoke, rpc_pb2.LeaseRevokeRequest(ID=lease_id),
                            retry_after_send=True)
        except LeaseNotFound:
            pass


def _first_kv(result: TxnResult) -> KeyValue | None:
    for op in result.responses:
        if op.WhichOneof("response") == "response_range" and op.response_range.kvs:
            return KeyValue.from_pb(op.response_range.kvs[0])
    return None


def _translate(exc: grpc.aio.AioRpcError) -> EtcdError:
    details = exc.details() or ""
    if "lease not found" in details:
        return LeaseNotFound(details)
    return EtcdError(f"{exc.code().name}: {details}")
