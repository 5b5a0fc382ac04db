"""``sqsq server``: one shard and the public gRPC API in one process (single-node mode)."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import sys
from pathlib import Path

import grpc
from aiohttp import web

from sqsq.core.state import ShardConfig
from sqsq.gateway.api import Endpoint, QueueApi
from sqsq.gateway.auth import Authenticator, GrpcAuthInterceptor, load_credentials
from sqsq.gateway.grpc_service import QueuesService
from sqsq.gateway.http import make_app
from sqsq.shard.admin import AdminService
from sqsq.shard.engine import ShardEngine
from sqsq.shard.store import RocksStore
from sqsq.v1 import admin_pb2_grpc
from sqsq.v1 import queues_pb2_grpc as pb_grpc

log = logging.getLogger("sqsq.server")

DEFAULT_GRPC_PORT = 7400
DEFAULT_HTTP_PORT = 9324


def load_secret(data_dir: Path) -> bytes:
    """The receipt-handle key: made once per data directory so handles survive restarts."""
    path = data_dir / "secret"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(data_dir, os.O_RDONLY)  # the rename itself must survive a crash
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path.read_bytes()


async def run_server(
    data_dir: str, host: str, grpc_port: int, http_port: int, *, sync: bool = True,
    credentials_file: str | None = None, region: str | None = None,
    account: str | None = None, public_url: str | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. Unset options fall back to env (SQSQ_CREDENTIALS_FILE,
    SQSQ_ACCESS_KEY_ID/SQSQ_SECRET_ACCESS_KEY, SQSQ_REGION, SQSQ_ACCOUNT, SQSQ_PUBLIC_URL)."""
    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    auth = Authenticator(load_credentials(credentials_file))
    config = ShardConfig(
        shard_id=0, secret=load_secret(root),
        region=region or os.environ.get("SQSQ_REGION") or ShardConfig.region,
        account=account or os.environ.get("SQSQ_ACCOUNT") or ShardConfig.account)
    engine = ShardEngine(RocksStore(str(root / "shard-0")), config, sync=sync)
    await engine.start()
    base_url = public_url or os.environ.get("SQSQ_PUBLIC_URL") or f"http://{host}:{http_port}"
    api = QueueApi(engine, Endpoint(base_url.rstrip("/"), config.account))
    # HTTP first: tests and scripts take the gRPC port listening as "ready".
    runner = web.AppRunner(make_app(api, auth), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    await web.TCPSite(runner, host, http_port).start()
    server = grpc.aio.server(interceptors=[GrpcAuthInterceptor(auth)])
    pb_grpc.add_QueuesServicer_to_server(QueuesService(api), server)
    admin_pb2_grpc.add_AdminServicer_to_server(AdminService({0: engine}, root / "snapshots"),
                                               server)
    bound = server.add_insecure_port(f"{host}:{grpc_port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"sqsq server: gRPC on {host}:{bound}, SQS HTTP API on {base_url} (region "
          f"{config.region}, account {config.account}), data in {root.resolve()}, fsync "
          f"{'on' if sync else 'off'}", flush=True)
    if auth.open:
        print("sqsq server: WARNING: no credentials configured - authentication is OFF, "
              "anyone who can reach these ports can use every queue. Set "
              "SQSQ_CREDENTIALS_FILE or SQSQ_ACCESS_KEY_ID/SQSQ_SECRET_ACCESS_KEY to require "
              "SigV4 (HTTP) and signed tokens (gRPC).", flush=True)
    else:
        print(f"sqsq server: authentication ON ({len(auth.credentials)} access key(s)); "
              "HTTP requires SigV4, gRPC a signed token", flush=True)
    await stop.wait()
    log.info("shutting down")
    engine.end_long_polls()
    await runner.cleanup()
    await server.stop(grace=2)
    await engine.stop()
    print("sqsq server: stopped", flush=True)


def serve(
    data_dir: str = "./data",
    host: str = "127.0.0.1",
    grpc_port: int = DEFAULT_GRPC_PORT,
    http_port: int = DEFAULT_HTTP_PORT,
    sync: bool = True,
    credentials_file: str | None = None,
    region: str | None = None,
    account: str | None = None,
    public_url: str | None = None,
) -> int:
    logging.basicConfig(level=os.environ.get("SQSQ_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(run_server(data_dir, host, grpc_port, http_port, sync=sync,
                               credentials_file=credentials_file, region=region,
                               account=account, public_url=public_url))
    except (OSError, ValueError) as e:  # unreadable credentials file, port in use, ...
        print(f"sqsq server: error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0
