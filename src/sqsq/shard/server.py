"""``sqsq server``: one shard and the public gRPC API in one process (single-node mode)."""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from sqsq.core.state import ShardConfig
from sqsq.gateway.api import QueueApi
from sqsq.gateway.auth import Authenticator, load_credentials
from sqsq.gateway.fronts import (
    announce_auth,
    endpoint_for,
    run_process,
    start_fronts,
    until_signalled,
)
from sqsq.shard.admin import AdminService
from sqsq.shard.engine import ShardEngine
from sqsq.shard.store import RocksStore
from sqsq.v1 import admin_pb2_grpc

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
    endpoint = endpoint_for(host, http_port, public_url, config.account)
    admin = AdminService({0: engine}, root / "snapshots")
    fronts = await start_fronts(
        QueueApi(engine, endpoint), auth, host, grpc_port, http_port,
        lambda server: admin_pb2_grpc.add_AdminServicer_to_server(admin, server))
    print(f"sqsq server: gRPC on {host}:{fronts.grpc_port}, SQS HTTP API on "
          f"{endpoint.base_url} (region {config.region}, account {config.account}), data in "
          f"{root.resolve()}, fsync {'on' if sync else 'off'}", flush=True)
    announce_auth("sqsq server", auth)
    await until_signalled()
    log.info("shutting down")
    engine.end_long_polls()
    await fronts.stop()
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
    return run_process("sqsq server", run_server(
        data_dir, host, grpc_port, http_port, sync=sync, credentials_file=credentials_file,
        region=region, account=account, public_url=public_url))
