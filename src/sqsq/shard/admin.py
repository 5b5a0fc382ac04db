"""The Admin gRPC service: point-in-time shard snapshots for export, taken without stopping writes.

A snapshot is the store's checkpoint (for RocksDB: hard-linked SST files plus a flushed
memtable), written under ``snapshot_root`` on the server's machine. The committer keeps
running while it is taken; RocksDB makes the checkpoint consistent at one sequence number, so
it holds whole group commits only.

Only a shard's leader snapshots it, and only after a barrier (ReadIndex: it confirms with a
quorum that it still leads and applies everything committed before the request arrived): a
follower's state can lag, and a deposed leader's can miss what the new one acknowledged. A
replica that does not lead answers NotLeader with the leader's address when it knows it, as
the shard service does, so the gateway's Admin (``sqsq.gateway.admin``) finds the leader
the way it routes any call.

For backups (``sqsq backup``), ``ReadSnapshot`` streams a snapshot's files to the caller (and,
when asked, the receipt-handle secret: a restore must sign and check handles with the same
key). ``ReplicaStatus`` reports each hosted replica's Raft progress (a rolling restart waits
on it).

Every Admin call must prove the admin credential (``sqsq.admincred``), also when the queue
API is open: the secret keys receipt handles and the Raft transport, whose peers unpickle
what they are sent, so handing it out is handing out the node. A call without the proof is
refused with PERMISSION_DENIED and one log line.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import grpc

from sqsq import admincred
from sqsq.api import SHARD_METADATA_KEY
from sqsq.core import keys, peek, records, regions
from sqsq.errors import ErrorCode, Rejection, not_leader_message
from sqsq.shard.engine import ShardEngine
from sqsq.shard.store import MemoryStore, RocksStore
from sqsq.v1 import admin_pb2 as pb
from sqsq.v1 import admin_pb2_grpc as pb_grpc
from sqsq.wire import ADMIN_METADATA_KEY, ERROR_CODE_KEY

log = logging.getLogger("sqsq.admin")

Engines = Mapping[int, ShardEngine] | Callable[[], Mapping[int, ShardEngine]]
CHUNK_BYTES = 1 << 20  # one ReadSnapshot message's data (gRPC's default limit is 4 MiB)


def checkpoint_meta(path: Path) -> records.Meta:
    """The Meta record inside a checkpoint (a RocksDB directory or a MemoryStore file)."""
    store = RocksStore(str(path)) if path.is_dir() else MemoryStore.load(str(path))
    try:
        return records.Meta.decode(store.get(keys.META_KEY))
    finally:
        store.close()


def take_snapshot(engine: ShardEngine, path: Path) -> tuple[int, records.Meta]:
    """Checkpoint ``engine``'s store at ``path``; (snapshot time, the checkpoint's Meta).

    The time is read after the checkpoint and raised to the checkpoint's last stamped ``now``,
    so every command in the checkpoint happened at or before it (timers due by then count as
    fired when the export evaluates states).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    engine.machine.checkpoint(str(path))
    now_ms = engine.now_ms()
    meta = checkpoint_meta(path)
    return max(now_ms, meta.last_now_ms), meta


class AdminService(pb_grpc.AdminServicer):
    """``engines`` maps shard id to the engine this process runs (or is a callable giving it,
    for nodes whose shards come and go). A request naming no shard snapshots every shard this
    process leads."""

    def __init__(self, engines: Engines, snapshot_root: Path | str, *,
                 admin_key: bytes | None, cluster_node: bool = False) -> None:
        self._engines = engines
        self.admin_key = admin_key  # None: every call is refused
        self.snapshot_root = Path(snapshot_root).resolve()
        self.cluster_node = cluster_node  # a node of a cluster: its gateway backs it up

    def _current(self) -> Mapping[int, ShardEngine]:
        return self._engines() if callable(self._engines) else self._engines

    async def CreateSnapshot(  # noqa: N802 (gRPC method name)
        self, request: pb.CreateSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateSnapshotResponse:
        await require_admin(context, self.admin_key, "CreateSnapshot")
        engines = self._current()
        wanted = list(request.shard_ids) or sorted(
            s for s, e in engines.items() if e.leading_term() is not None)
        missing = [s for s in wanted if s not in engines]
        if missing:
            # as the shard service answers a shard it does not host: try another replica
            await _abort(context, Rejection(
                ErrorCode.NOT_LEADER,
                f"shards not hosted here: {missing}. {not_leader_message(None)}"))
        # Leaders only, each with everything acknowledged before this call applied here:
        # all barriers first, so a refusal leaves no checkpoint behind.
        for rejection in await asyncio.gather(*(engines[s].barrier() for s in wanted)):
            if rejection is not None:
                await _abort(context, rejection)
        # one directory per call, named so that listing sorts by time
        token = f"{engines[wanted[0]].now_ms()}-{secrets.token_hex(4)}" if wanted else "none"
        out = []
        try:
            for shard_id in wanted:
                engine = engines[shard_id]
                path = self.snapshot_root / token / f"shard-{shard_id}"
                # a thread: the checkpoint flushes the memtable, which must not stall the loop
                snapshot_ms, meta = await asyncio.to_thread(take_snapshot, engine, path)
                out.append(pb.ShardSnapshot(
                    shard_id=shard_id, path=str(path), snapshot_ms=snapshot_ms,
                    applied_index=meta.applied_index, region=engine.config.region,
                    account=engine.config.account,
                ))
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, self.snapshot_root / token,
                                    ignore_errors=True)
            raise
        return pb.CreateSnapshotResponse(snapshots=out)

    async def _own_snapshot(self, raw: str, context: grpc.aio.ServicerContext) -> Path:
        """``raw`` resolved, if it is what CreateSnapshot made: a shard-N entry under our
        root (never anything else on this machine)."""
        path = Path(raw).resolve()
        if self.snapshot_root not in path.parents or not path.name.startswith("shard-"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"not a snapshot of this server: {raw}")
        return path

    async def DeleteSnapshot(  # noqa: N802 (gRPC method name)
        self, request: pb.DeleteSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteSnapshotResponse:
        await require_admin(context, self.admin_key, "DeleteSnapshot")
        path = await self._own_snapshot(request.path, context)
        if path.is_dir():
            await asyncio.to_thread(shutil.rmtree, path)
        elif path.exists():
            path.unlink()
        parent = path.parent
        if parent != self.snapshot_root and parent.exists() and not any(parent.iterdir()):
            parent.rmdir()
        return pb.DeleteSnapshotResponse()

    async def ReadSnapshot(  # noqa: N802 (gRPC method name)
        self, request: pb.ReadSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.SnapshotChunk]:
        await require_admin(context, self.admin_key, "ReadSnapshot")
        path = await self._own_snapshot(request.path, context)
        if not path.exists():
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no such snapshot: {request.path}")
        if request.include_secret:
            engines = self._current()
            if not engines:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "no shard is open here yet")
            yield pb.SnapshotChunk(secret=next(iter(engines.values())).config.secret)
        for name, file in await asyncio.to_thread(_snapshot_files, path):
            size = file.stat().st_size
            with file.open("rb") as f:
                offset = 0
                while True:
                    data = await asyncio.to_thread(f.read, CHUNK_BYTES)
                    if offset and not data:
                        break
                    yield pb.SnapshotChunk(name=name, offset=offset, data=data, size=size)
                    offset += len(data)
                    if len(data) < CHUNK_BYTES:
                        break

    async def ReadPartitionMap(  # noqa: N802 (gRPC method name)
        self, request: pb.ReadPartitionMapRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadPartitionMapResponse:
        await require_admin(context, self.admin_key, "ReadPartitionMap")
        if self.cluster_node:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "this is a node of a cluster: back the cluster up through "
                                "its gateway, which knows every shard and the partition map")
        return pb.ReadPartitionMapResponse(cluster=False)

    async def ReplicaStatus(  # noqa: N802 (gRPC method name)
        self, request: pb.ReplicaStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReplicaStatusResponse:
        await require_admin(context, self.admin_key, "ReplicaStatus")
        out = []
        for shard_id, engine in sorted(self._current().items()):
            replica = engine.replica
            out.append(pb.ReplicaState(
                shard_id=shard_id, leader=replica.is_leader(), term=replica.raftCurrentTerm,
                commit_index=replica.raftCommitIndex, applied_index=replica.raftLastApplied,
                leader_raft=replica.leader_address() or ""))
        return pb.ReplicaStatusResponse(replicas=out)


    async def PeekMessages(  # noqa: N802 (gRPC method name)
        self, request: pb.PeekMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.PeekMessagesResponse:
        """A queue's oldest messages, read as any client read is (the leader, after a
        barrier), changing nothing: for the gateway's web console."""
        await require_admin(context, self.admin_key, "PeekMessages")
        engine = self._current().get(_shard_named(context))
        if engine is None:
            await _abort(context, Rejection(ErrorCode.NOT_LEADER, not_leader_message(None)))
        home = engine.config.region
        if request.region and not regions.valid_region(request.region):
            await _abort(context, Rejection(ErrorCode.INVALID_PARAMETER_VALUE,
                                            f"{request.region!r} is not a region name."))
        key = regions.queue_key(request.region or home, request.queue_name, home)
        result = await engine.read(peek.peek_messages, key, request.max_number_of_messages)
        if isinstance(result, Rejection):
            await _abort(context, result)
        return peek_to_pb(result)


async def require_admin(context: grpc.aio.ServicerContext, key: bytes | None,
                        name: str) -> None:
    """Go on only if the call proves the admin credential; else PERMISSION_DENIED and one
    log line (who, which call, why)."""
    method = f"/sqsq.v1.Admin/{name}"
    value = next((v for k, v in context.invocation_metadata() or ()
                  if k == ADMIN_METADATA_KEY), None)
    if admincred.verify(key, value if isinstance(value, str) or value is None
                        else value.decode(), method):
        return
    if key is None:
        why = (f"this process has no admin credential (set {admincred.ENV_TOKEN_FILE} to "
               f"the cluster's {admincred.FILE_NAME})")
    elif value is None:
        why = (f"the call carries no admin credential (give the tool the server's or "
               f"cluster's {admincred.FILE_NAME}, or set {admincred.ENV_TOKEN_FILE})")
    else:
        why = "the admin credential does not match (or its time is off by over 5 minutes)"
    log.warning("Admin %s from %s refused: %s", name, context.peer(), why)
    await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"Admin {name} refused: {why}",
                        trailing_metadata=((ERROR_CODE_KEY, "AccessDenied"),))


def _shard_named(context: grpc.aio.ServicerContext) -> int:
    """The shard a call names in its metadata (shard 0 when none, or a malformed one)."""
    for key, value in context.invocation_metadata() or ():
        if key == SHARD_METADATA_KEY:
            return int(value) if str(value).isdigit() else -1
    return 0


def peek_to_pb(p: peek.Peek) -> pb.PeekMessagesResponse:
    return pb.PeekMessagesResponse(
        messages=[pb.PeekedMessage(
            message_id=m.message_id, body=m.body, body_truncated=m.body_truncated,
            sent_ms=m.sent_ms, state=m.state, receive_count=m.receive_count,
            visible_at_ms=m.visible_at_ms, group_id=m.group_id,
            dead_letter_source_arn=m.dead_letter_source_arn) for m in p.messages],
        oldest_sent_ms=p.oldest_sent_ms, now_ms=p.now_ms)


def _snapshot_files(path: Path) -> list[tuple[str, Path]]:
    """(name relative to ``path``, file) for each regular file of a snapshot, sorted; a
    snapshot that is one file (a MemoryStore's) is that file, named after itself."""
    if path.is_file():
        return [(path.name, path)]
    return sorted((str(f.relative_to(path)), f) for f in path.rglob("*")
                  if f.is_file() and not f.is_symlink())


async def _abort(context: grpc.aio.ServicerContext, rejection: Rejection) -> None:
    """Fail the call as the shard service fails one: the status from the error table, the
    SQS code in the trailing metadata (so a NotLeader is followed like any other)."""
    await context.abort(getattr(grpc.StatusCode, rejection.code.spec.grpc_status),
                        rejection.message,
                        trailing_metadata=((ERROR_CODE_KEY, rejection.code.sqs_code),))
