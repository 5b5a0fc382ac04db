"""``sqsq gateway``: the public SQS HTTP and gRPC doors in a process of their own, in front
of the node that holds the queues. Stateless: stop it, start another, nothing is lost.

Today the partition map is static with one shard (``--backend``, the node's gRPC address),
as in single-node mode; the etcd-held map, routing to shard leaders and partitioned queues
come with the cluster.
"""

from __future__ import annotations

import os

from sqsq.core.state import ShardConfig
from sqsq.gateway.auth import Authenticator, load_credentials
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
    backend: str, host: str, grpc_port: int, http_port: int, *,
    credentials_file: str | None = None, account: str | None = None,
    public_url: str | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. Calls to the node are signed with SQSQ_ACCESS_KEY_ID /
    SQSQ_SECRET_ACCESS_KEY when those are set (the node then checks them like any client)."""
    auth = Authenticator(load_credentials(credentials_file))
    account = account or os.environ.get("SQSQ_ACCOUNT") or ShardConfig.account
    endpoint = endpoint_for(host, http_port, public_url, account)
    api = ForwardingApi(backend, endpoint)
    fronts = await start_fronts(api, auth, host, grpc_port, http_port)
    print(f"sqsq gateway: gRPC on {host}:{fronts.grpc_port}, SQS HTTP API on "
          f"{endpoint.base_url}, forwarding to the node at {backend}", flush=True)
    announce_auth("sqsq gateway", auth)
    await until_signalled()
    await fronts.stop()
    await api.close()
    print("sqsq gateway: stopped", flush=True)


def serve_gateway(
    backend: str, host: str = "127.0.0.1", grpc_port: int = DEFAULT_GRPC_PORT,
    http_port: int = DEFAULT_HTTP_PORT, credentials_file: str | None = None,
    account: str | None = None, public_url: str | None = None,
) -> int:
    return run_process("sqsq gateway", run_gateway(
        backend, host, grpc_port, http_port, credentials_file=credentials_file,
        account=account, public_url=public_url))
