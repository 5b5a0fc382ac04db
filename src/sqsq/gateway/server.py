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
from collections.abc import Awaitable

from prometheus_client import CollectorRegistry

from sqsq.client import _ops
from sqsq.control.etcd import Etcd, EtcdError
from sqsq.control.partition_map import PartitionMap
from sqsq.core.state import ShardConfig
from sqsq.errors import NotLeader, QueueError, ServiceUnavailable
from sqsq.gateway.admin import ClusterAdmin
from sqsq.gateway.auth import Authenticator, load_credentials
from sqsq.gateway.cluster import ClusterApi
from sqsq.gateway.console import ClusterSource, NodeSource
from sqsq.gateway.forwarding import ForwardingApi
from sqsq.gateway.frames import frame_port_setting
from sqsq.gateway.fronts import (
    announce,
    announce_auth,
    api_metrics,
    endpoint_for,
    run_process,
    start_fronts,
    until_signalled,
)
from sqsq.gateway.metrics import RoutingMetrics
from sqsq.gateway.opsport import start_ops_port

DEFAULT_GRPC_PORT = 7400  # the gateway is the public face: the ports clients expect
DEFAULT_HTTP_PORT = 9324
PROBE_TIMEOUT_S = 2.0  # /readyz: a shard whose leader does not answer a read within this
PROBE_PREFIX = "sqsq-readyz-probe"  # a ListQueues no queue is likely to match: cheap


async def _probe(name: str, ask: Awaitable[object]) -> str | None:
    """None if a leader answered (any SQS answer but NotLeader/unavailable), else why not."""
    try:
        await asyncio.wait_for(ask, PROBE_TIMEOUT_S)
    except TimeoutError:
        return f"{name}: no leader answered within {PROBE_TIMEOUT_S:g} s"
    except (NotLeader, ServiceUnavailable) as exc:
        return f"{name}: {exc.code}: {exc.message}"
    except QueueError:
        return None  # a leader answered, if only to refuse (credentials)
    return None


async def cluster_problems(api: ClusterApi) -> list[str]:
    """A map with shards, and a leader answering for each one."""
    shards = sorted(api.map.snapshot.shards)
    if not shards:
        return ["the partition map has no shards yet"]
    found = await asyncio.gather(*(
        _probe(f"shard {s}", api.caller.call(s, _ops.list_queues(PROBE_PREFIX, 1)))
        for s in shards))
    return [p for p in found if p is not None]


async def backend_problems(api: ForwardingApi) -> list[str]:
    """The node behind answers a read (which it does only while it leads)."""
    found = await _probe(f"the node at {api.target}", api.list_queues(PROBE_PREFIX, 1))
    return [] if found is None else [found]


async def run_gateway(
    backend: str | None, host: str, grpc_port: int, http_port: int, *,
    etcd: str | None = None, partitions: int = 1,
    credentials_file: str | None = None, account: str | None = None,
    region: str | None = None, public_url: str | None = None,
    metrics_port: int | None = None,
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
    registry = CollectorRegistry()
    if isinstance(api, ClusterApi):
        routing = RoutingMetrics(registry)
        api.caller.on_retry = routing.retried
        api.caller.on_pass = routing.passed
    fronts = await start_fronts(api, auth, host, grpc_port, http_port,
                                add_services=admin.register if admin is not None else None,
                                metrics=api_metrics(registry),
                                console=ClusterSource(api) if etcd else NodeSource(api),
                                frame_port=frame_port_setting())
    ops = None
    if metrics_port is not None:
        checked = api

        async def readiness() -> list[str]:
            if isinstance(checked, ClusterApi):
                return await cluster_problems(checked)
            return await backend_problems(checked)

        ops = await start_ops_port(host, metrics_port, registry, readiness)
    announce(f"sqsq gateway: gRPC on {host}:{fronts.grpc_port}, SQS HTTP API on "
             f"{endpoint.base_url} (region {region}), {behind}"
             + (f", metrics on http://{host}:{ops.port}" if ops is not None else ""))
    announce_auth("sqsq gateway", auth)
    # In the background: a node that is slow to answer must not hold up the start.
    probe = asyncio.create_task(api.probe()) if isinstance(api, ForwardingApi) else None
    await until_signalled()
    if probe is not None:
        probe.cancel()
    await fronts.stop()
    if ops is not None:
        await ops.stop()
    await api.close()
    if admin is not None:
        await admin.close()
    if pmap is not None:
        await pmap.close()
    if client is not None:
        await client.close()
    announce("sqsq gateway: stopped")


def serve_gateway(
    backend: str | None = None, host: str = "127.0.0.1", grpc_port: int = DEFAULT_GRPC_PORT,
    http_port: int = DEFAULT_HTTP_PORT, credentials_file: str | None = None,
    account: str | None = None, public_url: str | None = None, *, etcd: str | None = None,
    partitions: int = 1, region: str | None = None, metrics_port: int | None = None,
    log_format: str = "text",
) -> int:
    return run_process("sqsq gateway", run_gateway(
        backend, host, grpc_port, http_port, etcd=etcd, partitions=partitions,
        credentials_file=credentials_file, account=account, region=region,
        public_url=public_url, metrics_port=metrics_port), log_format)
