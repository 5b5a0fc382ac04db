"""``sqsq gateway``: the public SQS HTTP and gRPC doors in a process of their own. Stateless:
stop it, start another, nothing is lost.

- ``--etcd``: in front of a cluster. It loads the partition map from etcd, follows it through
  a watch, and routes each call to the leader of the shard that holds the queue
  (``gateway.cluster``). While etcd is away it keeps serving from the map it has. It also
  serves the Admin API (``gateway.admin``), so ``sqsq export`` can snapshot every shard.
- ``--backend``: in front of one node (``sqsq server`` or a node of a static group).
"""

from __future__ import annotations

import asyncio
import os

from sqsq.control.etcd import Etcd, EtcdError
from sqsq.control.partition_map import PartitionMap
from sqsq.core.state import ShardConfig
from sqsq.gateway.admin import ClusterAdmin
from sqsq.gateway.auth import Authenticator, load_credentials
from sqsq.gateway.cluster import ClusterApi
from sqsq.gateway.forwarding import ForwardingApi
from sqsq.gateway.fronts import (
    announce_auth,
    endpoint_for,
    run_process,
    start_fronts,
    until_signalled,
)

DEFAULT_GRPC_PORT = 7400  # the gateway is the public face: the ports clients expect
DEFAULT_HTTP_PORT = 9324


async def run_gateway(
    backend: str | None, host: str, grpc_port: int, http_port: int, *,
    etcd: str | None = None, partitions: int = 1,
    credentials_file: str | None = None, account: str | None = None,
    region: str | None = None, public_url: str | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. Calls to the nodes are signed with SQSQ_ACCESS_KEY_ID /
    SQSQ_SECRET_ACCESS_KEY when those are set (the node then checks them like any client).
    Account and region are the nodes' (the region is the one callers who name none are in)."""
    auth = Authenticator(load_credentials(credentials_file))
    account = account or os.environ.get("SQSQ_ACCOUNT") or ShardConfig.account
    region = region or os.environ.get("SQSQ_REGION") or ShardConfig.region
    endpoint = endpoint_for(host, http_port, public_url, account, region)
    if partitions < 1:
        raise ValueError(f"--partitions must be at least 1, not {partitions}")
    client = pmap = None
    admin: ClusterAdmin | None = None
    if etcd is not None:
        client = Etcd(etcd)
        try:
            pmap = await PartitionMap.load(client)
        except EtcdError as exc:
            raise OSError(f"cannot load the partition map from etcd at {etcd}: {exc}") from None
        api: ClusterApi | ForwardingApi = ClusterApi(client, pmap, endpoint,
                                                     partitions=partitions)
        admin = ClusterAdmin(api.caller)
        behind = f"routing over the cluster at etcd {etcd}"
    else:
        assert backend is not None
        api = ForwardingApi(backend, endpoint)
        behind = f"forwarding to the node at {backend}"
    fronts = await start_fronts(api, auth, host, grpc_port, http_port,
                                add_services=admin.register if admin is not None else None)
    print(f"sqsq gateway: gRPC on {host}:{fronts.grpc_port}, SQS HTTP API on "
          f"{endpoint.base_url} (region {region}), {behind}", flush=True)
    announce_auth("sqsq gateway", auth)
    # In the background: a node that is slow to answer must not hold up the start.
    probe = asyncio.create_task(api.probe()) if isinstance(api, ForwardingApi) else None
    await until_signalled()
    if probe is not None:
        probe.cancel()
    await fronts.stop()
    await api.close()
    if admin is not None:
        await admin.close()
    if pmap is not None:
        await pmap.close()
    if client is not None:
        await client.close()
    print("sqsq gateway: stopped", flush=True)


def serve_gateway(
    backend: str | None = None, host: str = "127.0.0.1", grpc_port: int = DEFAULT_GRPC_PORT,
    http_port: int = DEFAULT_HTTP_PORT, credentials_file: str | None = None,
    account: str | None = None, public_url: str | None = None, *, etcd: str | None = None,
    partitions: int = 1, region: str | None = None,
) -> int:
    return run_process("sqsq gateway", run_gateway(
        backend, host, grpc_port, http_port, etcd=etcd, partitions=partitions,
        credentials_file=credentials_file, account=account, region=region,
        public_url=public_url))
