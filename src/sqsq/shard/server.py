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

from sqsq.core.state import ShardConfig
from sqsq.gateway.api import Endpoint, QueueApi
from sqsq.gateway.grpc_service import QueuesService
from sqsq.shard.engine import ShardEngine
from sqsq.shard.store import RocksStore
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
    return path.read_bytes()


async def run_server(
    data_dir: str, host: str, grpc_port: int, http_port: int, *, sync: bool = True
) -> None:
    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    config = ShardConfig(shard_id=0, secret=load_secret(root))
    engine = ShardEngine(RocksStore(str(root / "shard-0")), config, sync=sync)
    await engine.start()
    api = QueueApi(engine, Endpoint(f"http://{host}:{http_port}", config.account))
    server = grpc.aio.server()
    pb_grpc.add_QueuesServicer_to_server(QueuesService(api), server)
    bound = server.add_insecure_port(f"{host}:{grpc_port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"sqsq server: gRPC on {host}:{bound}, data in {root.resolve()}, fsync "
          f"{'on' if sync else 'off'}; the SQS HTTP API (port {http_port}) is not built yet",
          flush=True)
    await stop.wait()
    log.info("shutting down")
    await server.stop(grace=2)
    await engine.stop()
    print("sqsq server: stopped", flush=True)


def serve(
    data_dir: str = "./data",
    host: str = "127.0.0.1",
    grpc_port: int = DEFAULT_GRPC_PORT,
    http_port: int = DEFAULT_HTTP_PORT,
    sync: bool = True,
) -> int:
    logging.basicConfig(level=os.environ.get("SQSQ_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run_server(data_dir, host, grpc_port, http_port, sync=sync))
    return 0
