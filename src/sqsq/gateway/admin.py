"""The Admin API over a cluster: what ``sqsq gateway --etcd`` answers ``sqsq export`` with.

- **CreateSnapshot** asks each shard's leader for a checkpoint of that one shard, found the
  way any call finds it (``ShardCaller.targets``: the likeliest leader first; NotLeader is
  followed, a node that cannot be reached is passed over). The node takes a barrier first, so
  the checkpoint holds everything acknowledged before the call (``sqsq.shard.admin``). The
  answer lists every shard's checkpoint under its cluster shard id. If one shard fails, the
  checkpoints already made are released and the call fails.
- **DeleteSnapshot** goes to the node that made the checkpoint. The gateway remembers which
  node that was, for the last ``MAX_REMEMBERED`` checkpoints; a gateway restarted in between
  has forgotten, and the checkpoint stays on the node's disk (under its ``snapshots/``).

- **ReadSnapshot** (``sqsq backup``) streams a checkpoint's files from the node that made it,
  through the gateway, so a backup needs no access to the nodes' disks.
- **ReadPartitionMap** answers the shard and queue records of the partition map this gateway
  follows (a restore recreates them in the new cluster's etcd).

Every call must prove the admin credential (``sqsq.admincred``; the gateway reads it from env
``SQSQ_ADMIN_TOKEN`` or ``SQSQ_ADMIN_TOKEN_FILE``, which ``sqsq cluster up`` sets), and the
gateway proves the same credential to the nodes. Without one, it refuses every Admin call.

A checkpoint is a directory on its node's disk, and the exporter reads it from the path it is
given: ``sqsq export --endpoint GATEWAY`` works where the nodes' data directories are visible
at the same paths (one machine, as ``sqsq cluster up`` runs it, or a shared filesystem).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator

import grpc
import grpc.aio

from sqsq import admincred
from sqsq.api import SHARD_METADATA_KEY
from sqsq.client import _auth, _call
from sqsq.control import keys
from sqsq.errors import InternalError, QueueError
from sqsq.gateway.auth import ERROR_CODE_KEY, GRPC_METADATA_KEY, grpc_token
from sqsq.gateway.routing import ShardCaller, follow_leader
from sqsq.shard.admin import require_admin
from sqsq.v1 import admin_pb2 as pb
from sqsq.v1 import admin_pb2_grpc as pb_grpc

log = logging.getLogger("sqsq.admin")
_FROM_ENV = object()
CALL_TIMEOUT_S = 30.0  # one node's checkpoint (a memtable flush) is given this long
MAX_REMEMBERED = 4096  # checkpoints whose node the gateway remembers for DeleteSnapshot


class ClusterAdmin(pb_grpc.AdminServicer):
    def __init__(self, caller: ShardCaller, *, timeout_s: float = CALL_TIMEOUT_S,
                 credentials: tuple[str, str] | None = None,
                 admin_key: bytes | None | object = _FROM_ENV) -> None:
        self.caller = caller
        self.admin_key: bytes | None = admincred.load() if admin_key is _FROM_ENV \
            else admin_key  # type: ignore[assignment]
        if self.admin_key is None:
            log.warning("no admin credential (%s or %s): every Admin call (backup, export) "
                        "is refused", admincred.ENV_TOKEN, admincred.ENV_TOKEN_FILE)
        self.timeout_s = timeout_s
        self._creds = _auth.resolve(credentials)
        self._stubs: dict[str, tuple[grpc.aio.Channel, pb_grpc.AdminStub]] = {}
        self._made: OrderedDict[str, str] = OrderedDict()  # checkpoint path -> node address

    def register(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_AdminServicer_to_server(self, server)

    async def close(self) -> None:
        for channel, _ in self._stubs.values():
            await channel.close()
        self._stubs.clear()

    def _stub(self, target: str) -> pb_grpc.AdminStub:
        if target not in self._stubs:
            # the channel the gateway's shard calls use (options, signed tokens), for Admin
            channel = _auth.signed_aio_channel(target, self._creds)
            self._stubs[target] = (channel, pb_grpc.AdminStub(channel))
        return self._stubs[target][1]

    async def CreateSnapshot(  # noqa: N802 (gRPC method name)
        self, request: pb.CreateSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateSnapshotResponse:
        await require_admin(context, self.admin_key, "CreateSnapshot")
        shards = self.caller.map.snapshot.shards
        wanted = sorted(set(request.shard_ids)) or sorted(shards)
        unknown = [s for s in wanted if s not in shards]
        if unknown:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"shards not in the partition map: {unknown}")
        results = await asyncio.gather(*(self._snapshot(s) for s in wanted),
                                       return_exceptions=True)
        made = [r for r in results if isinstance(r, tuple)]
        failed = [r for r in results if not isinstance(r, tuple)]
        if failed:
            await asyncio.gather(*(self._delete(node, snap.path) for node, snap in made),
                                 return_exceptions=True)
            error = failed[0]
            if not isinstance(error, QueueError):
                raise error
            await context.abort(getattr(grpc.StatusCode, error.error_code.spec.grpc_status),
                                error.message, trailing_metadata=((ERROR_CODE_KEY, error.code),))
        for node, snap in made:
            self._made[snap.path] = node
            while len(self._made) > MAX_REMEMBERED:
                self._made.popitem(last=False)
        return pb.CreateSnapshotResponse(snapshots=[snap for _, snap in made])

    async def _snapshot(self, shard_id: int) -> tuple[str, pb.ShardSnapshot]:
        """(the node that answered, its checkpoint of ``shard_id``), from the shard's leader."""
        request = pb.CreateSnapshotRequest(shard_ids=[shard_id])
        # safe to repeat: a repeat costs at most a leftover checkpoint, never data
        call = _call.Call("CreateSnapshot", request, parse=lambda r: r, retry=True,
                          min_timeout=self.timeout_s)
        route = _call.Route(",".join(self.caller.targets(shard_id)))
        metadata = ((SHARD_METADATA_KEY, str(shard_id)),
                    *self._admin("CreateSnapshot"))
        target, response = await follow_leader(route, call, lambda target: self._stub(
            target).CreateSnapshot(request, timeout=self.timeout_s, metadata=metadata))
        snaps = [s for s in response.snapshots if s.shard_id == shard_id]
        if len(snaps) != 1:  # a node that broke the contract: not worth a retry
            raise InternalError(f"node {target} answered a snapshot of shard {shard_id} "
                                f"with {len(response.snapshots)} entries")
        return target, snaps[0]

    def _admin(self, name: str) -> tuple[tuple[str, str], ...]:
        return admincred.metadata(self.admin_key, f"/sqsq.v1.Admin/{name}")

    async def _delete(self, node: str, path: str) -> None:
        await self._stub(node).DeleteSnapshot(pb.DeleteSnapshotRequest(path=path),
                                              timeout=self.timeout_s,
                                              metadata=self._admin("DeleteSnapshot"))

    async def DeleteSnapshot(  # noqa: N802 (gRPC method name)
        self, request: pb.DeleteSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteSnapshotResponse:
        await require_admin(context, self.admin_key, "DeleteSnapshot")
        node = self._made.get(request.path)
        if node is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"not a snapshot this gateway made: {request.path}")
        try:
            await self._delete(node, request.path)
        except grpc.RpcError as err:
            await context.abort(err.code(), f"{node}: {err.details()}")
        self._made.pop(request.path, None)
        return pb.DeleteSnapshotResponse()

    async def ReadSnapshot(  # noqa: N802 (gRPC method name)
        self, request: pb.ReadSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.SnapshotChunk]:
        await require_admin(context, self.admin_key, "ReadSnapshot")
        node = self._made.get(request.path)
        if node is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"not a snapshot this gateway made: {request.path}")
        # no deadline: a large checkpoint takes as long as it takes to stream. Signed here:
        # the channel's token interceptor signs unary calls only.
        method = "/sqsq.v1.Admin/ReadSnapshot"
        metadata = ((GRPC_METADATA_KEY, grpc_token(*self._creds, method)),) if self._creds \
            else ()
        metadata += self._admin("ReadSnapshot")
        stream = self._stub(node).ReadSnapshot(request, metadata=metadata)
        try:
            async for chunk in stream:
                yield chunk
        except grpc.RpcError as err:
            await context.abort(err.code(), f"{node}: {err.details()}")
        finally:
            stream.cancel()

    async def ReadPartitionMap(  # noqa: N802 (gRPC method name)
        self, request: pb.ReadPartitionMapRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadPartitionMapResponse:
        await require_admin(context, self.admin_key, "ReadPartitionMap")
        snapshot = self.caller.map.snapshot
        records = [pb.MapRecord(key=keys.shard_key(s.shard_id), value=keys.encode(s))
                   for s in sorted(snapshot.shards.values(), key=lambda s: s.shard_id)]
        records += [pb.MapRecord(key=keys.queue_key(q.name), value=keys.encode(q))
                    for q in sorted(snapshot.queues.values(), key=lambda q: q.name)]
        return pb.ReadPartitionMapResponse(cluster=True, records=records)
