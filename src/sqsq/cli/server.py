"""Where processes are composed: ``sqsq server`` (single node) and ``sqsq node`` (a member of
a three-replica cluster). Both are the same parts: a shard replica (store, Raft member,
engine), the shard service over it, and the doors a process opens.

- ``sqsq server``: one shard in a one-member Raft group, with the public gRPC and SQS HTTP
  doors in the same process: the embedded default, no etcd, no peers.
- ``sqsq node``: one replica of each shard it is given, peers named by ``--peers``, serving
  the shard service over gRPC (a follower answers NotLeader with the leader's address; the
  gateway or SDK follows it). The public HTTP door is the gateway's.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry

from sqsq import admincred
from sqsq.api import Endpoint
from sqsq.control.agent import NodeAgent
from sqsq.control.controller import ControllerSettings
from sqsq.control.etcd import Etcd, EtcdError
from sqsq.control.keys import NodeRecord
from sqsq.core.state import ShardConfig
from sqsq.gateway.auth import Authenticator, load_credentials
from sqsq.gateway.console import LocalSource
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
from sqsq.gateway.opsport import OpsPort, Readiness, start_ops_port
from sqsq.shard.admin import AdminService
from sqsq.shard.clock import clock_from_env
from sqsq.shard.directory import ShardDirectory
from sqsq.shard.engine import ShardEngine
from sqsq.shard.host import (
    Peer,
    PeerNetwork,
    ReplicaOptions,
    load_secret,
    open_replica,
    parse_peers,
)
from sqsq.shard.metrics import ShardMetrics, replica_problems
from sqsq.shard.service import ShardService
from sqsq.v1 import admin_pb2_grpc

log = logging.getLogger("sqsq.server")

DEFAULT_GRPC_PORT = 7400
DEFAULT_HTTP_PORT = 9324
READY_TIMEOUT_S = 60.0  # a replica replays its journal before it leads
# A replicated write crosses threads (the event loop, the Raft log's writer thread, the
# applier's worker); a thread woken by another waits for the GIL up to this long. Python's
# default 5 ms more than doubled a single send's latency when Raft had a thread of its own;
# on the event loop the two measure alike (docs/benchmarks.md), and the short wait stays.
GIL_SWITCH_INTERVAL_S = 0.0002


def peer_key(secret: bytes) -> bytes:
    """The key Raft peers prove to each other before anything they send is read: every node
    derives the same one from the cluster secret it already shares (never the secret itself,
    which signs receipt handles)."""
    return hmac.new(secret, b"sqsq raft transport", hashlib.sha256).digest()


def _config(secret: bytes, region: str | None, account: str | None,
            shard_id: int = 0) -> ShardConfig:
    return ShardConfig(
        shard_id=shard_id, secret=secret,
        region=region or os.environ.get("SQSQ_REGION") or ShardConfig.region,
        account=account or os.environ.get("SQSQ_ACCOUNT") or ShardConfig.account)


async def _open_ops(name: str, host: str, metrics_port: int | None,
                    registry: CollectorRegistry, readiness: Readiness) -> OpsPort | None:
    """The metrics and health port, if asked for; opened first, so a probe sees the process
    replaying its journal as alive and not ready rather than not answering at all."""
    if metrics_port is None:
        return None
    ops = await start_ops_port(host, metrics_port, registry, readiness)
    announce(f"{name}: metrics, /healthz and /readyz on http://{host}:{ops.port}")
    return ops


async def _serve(name: str, engine: ShardEngine, endpoint: Endpoint, auth: Authenticator,
                 host: str, grpc_port: int, http_port: int | None, root: Path,
                 banner: str, registry: CollectorRegistry, ops: OpsPort | None,
                 serving: list[bool], network: PeerNetwork | None = None) -> None:
    admin = AdminService({0: engine}, root / "snapshots",
                         admin_key=admincred.load(root, create=True))
    service = ShardService(engine, endpoint)
    fronts = await start_fronts(
        service, auth, host, grpc_port, http_port,
        lambda server: admin_pb2_grpc.add_AdminServicer_to_server(admin, server),
        metrics=api_metrics(registry), console=LocalSource(service, f"{host}:{grpc_port}"),
        frame_port=frame_port_setting())
    serving[0] = True
    announce(f"{name}: gRPC on {host}:{fronts.grpc_port}{banner}")
    announce_auth(name, auth)
    await until_signalled()
    log.info("shutting down")
    serving[0] = False
    engine.end_long_polls()
    await _hand_over({0: engine})
    await fronts.stop()
    if ops is not None:
        await ops.stop()
    await engine.stop()
    if network is not None:
        await network.stop()  # last: the hand-over and the stop still talk to peers
    announce(f"{name}: stopped")


async def _hand_over(engines: dict[int, ShardEngine]) -> None:
    """A graceful stop: every shard this process leads gets its next leader first, so it is
    not left leaderless for an election timeout (``ShardEngine.hand_over``)."""
    # A list: the node's agent may open another shard meanwhile. Each shard led here goes
    # to another caught-up follower in turn, so they do not all land on one node.
    shards = [(shard_id, engine) for shard_id, engine in engines.items()
              if engine.leading_term() is not None]
    moved = await asyncio.gather(*(engine.hand_over(pick=i)
                                   for i, (_, engine) in enumerate(shards)))
    for (shard_id, _), leader in zip(shards, moved, strict=True):
        if leader is not None:
            log.info("shard %d: leadership handed to %s before stopping", shard_id, leader)


def _serving_problems(serving: list[bool]) -> list[str]:
    return [] if serving[0] else ["not serving: starting up or shutting down"]


async def run_server(
    data_dir: str, host: str, grpc_port: int, http_port: int, *, sync: bool = True,
    credentials_file: str | None = None, region: str | None = None,
    account: str | None = None, public_url: str | None = None,
    metrics_port: int | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. Unset options fall back to env (SQSQ_CREDENTIALS_FILE,
    SQSQ_ACCESS_KEY_ID/SQSQ_SECRET_ACCESS_KEY, SQSQ_REGION, SQSQ_ACCOUNT, SQSQ_PUBLIC_URL)."""
    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    auth = Authenticator(load_credentials(credentials_file))
    config = _config(load_secret(root / "secret"), region, account)
    admincred.load(root, create=True)  # made now: the operator finds it before any call
    # A one-member group: its own Raft port is never dialled, so any free loopback one will do.
    me = Peer("127.0.0.1", grpc_port, 0)
    engine = open_replica(0, root / "shard-0", config, me, [me],
                          ReplicaOptions(bootstrap=True, durable=sync,
                                         wall_clock_ms=clock_from_env(root)), None)
    registry = CollectorRegistry()
    ShardMetrics(registry, {0: engine})
    serving = [False]

    async def readiness() -> list[str]:
        # Leading, with its journal replayed (a one-member group leads once it has).
        problems = replica_problems(0, engine)
        if not engine.replica.is_leader():
            problems.append("shard 0: not leading yet (replaying its journal)")
        return problems + _serving_problems(serving)

    ops = await _open_ops("sqsq server", host, metrics_port, registry, readiness)
    await engine.start()
    if not await engine.wait_leading(READY_TIMEOUT_S):
        raise OSError("the shard did not become ready")
    endpoint = endpoint_for(host, http_port, public_url, config.account, config.region)
    await _serve("sqsq server", engine, endpoint, auth, host, grpc_port, http_port, root,
                 f", SQS HTTP API on {endpoint.base_url} (region {config.region}, account "
                 f"{config.account}), data in {root.resolve()}, fsync "
                 f"{'on' if sync else 'off'}", registry, ops, serving)


async def run_node(
    data_dir: str, host: str, grpc_port: int, raft_port: int, peers: str, *,
    bootstrap: bool = False, sync: bool = True, secret_file: str | None = None,
    credentials_file: str | None = None, region: str | None = None,
    account: str | None = None, compaction_min_entries: int = 5000,
    metrics_port: int | None = None,
) -> None:
    """One replica of shard 0 in a group of ``peers``; serve until SIGTERM/SIGINT."""
    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    members = parse_peers(peers)
    me = next((p for p in members if p.grpc_port == grpc_port and p.raft_port == raft_port),
              None)
    if me is None:
        raise ValueError(f"--peers must list this node ({host}:{grpc_port}:{raft_port})")
    config = _config(_cluster_secret(secret_file), region, account)
    auth = Authenticator(load_credentials(credentials_file))
    admincred.load(root, create=True)
    network = PeerNetwork(me, host, peer_key(config.secret), root)
    engine = open_replica(
        0, root / "shard-0", config, me, members,
        ReplicaOptions(bootstrap=bootstrap, durable=sync,
                       compaction_min_entries=compaction_min_entries,
                       wall_clock_ms=clock_from_env(root)), network)
    registry = CollectorRegistry()
    ShardMetrics(registry, {0: engine})
    serving = [False]

    async def readiness() -> list[str]:
        return replica_problems(0, engine) + _serving_problems(serving)

    ops = await _open_ops("sqsq node", host, metrics_port, registry, readiness)
    await network.start()
    await engine.start()
    endpoint = endpoint_for(host, grpc_port, None, config.account, config.region)
    await _serve("sqsq node", engine, endpoint, auth, host, grpc_port, None, root,
                 f", Raft on {me.raft(0)}, peers {', '.join(p.grpc for p in members)}",
                 registry, ops, serving, network)


def _cluster_secret(secret_file: str | None) -> bytes:
    secret_path = Path(secret_file or os.environ.get("SQSQ_CLUSTER_SECRET_FILE") or "")
    if not secret_path.name or not secret_path.is_file():
        raise ValueError("a node needs the cluster's receipt-handle secret: --secret-file or "
                         "SQSQ_CLUSTER_SECRET_FILE (the same file on every node)")
    return admincred.check_length(secret_path.read_bytes(), secret_path,
                                  "cluster secret")


async def run_cluster_node(
    data_dir: str, host: str, grpc_port: int, raft_port: int, etcd: str, node_id: str,
    shards: int, *, advertise: str | None = None, sync: bool = True,
    secret_file: str | None = None, credentials_file: str | None = None,
    region: str | None = None, account: str | None = None,
    compaction_min_entries: int = 5000, replace_after_s: float = 10.0,
    initial_nodes: int = 3, metrics_port: int | None = None, host_label: str = "",
) -> None:
    """A node of an etcd-coordinated cluster: it hosts a replica of each shard the partition
    map gives it (shard s's Raft group on ``raft_port + s``), serving them all on one gRPC
    port, and takes its turn as controller. Serve until SIGTERM/SIGINT."""
    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    secret = _cluster_secret(secret_file)
    auth = Authenticator(load_credentials(credentials_file))
    address = advertise or host
    me = NodeRecord(node_id, f"{address}:{grpc_port}", f"{address}:{raft_port}", host_label)
    config = _config(secret, region, account)
    endpoint = endpoint_for(address, grpc_port, None, config.account, config.region)
    directory = ShardDirectory()
    engines: dict[int, ShardEngine] = {}
    network = PeerNetwork(Peer.of(me), host, peer_key(secret), root)
    wall_clock = clock_from_env(root)
    registry = CollectorRegistry()
    shard_metrics = ShardMetrics(registry, engines)

    async def open_shard(shard_id: int, peers: list[NodeRecord], bootstrap: bool) -> ShardEngine:
        config = _config(secret, region, account, shard_id)
        engine = open_replica(
            shard_id, root / f"shard-{shard_id}", config, Peer.of(me),
            [Peer.of(p) for p in peers],
            ReplicaOptions(bootstrap=bootstrap, durable=sync,
                           compaction_min_entries=compaction_min_entries,
                           wall_clock_ms=wall_clock,
                           grpc_of=lambda raft: grpc_of(shard_id, raft)), network)
        await engine.start()
        engines[shard_id] = engine
        shard_metrics.attach(shard_id, engine)
        directory.add(shard_id, ShardService(engine, endpoint))
        return engine

    def grpc_of(shard_id: int, raft: str | None) -> str | None:
        """A member's gRPC address, from the partition map (members may join later)."""
        members = agent.map.snapshot.members.values() if agent.map is not None else ()
        return next((m.grpc_address for m in members if m.raft_for(shard_id) == raft), None)

    admin = AdminService(engines, root / "snapshots", cluster_node=True,
                         admin_key=admincred.load(root, create=True))
    fronts = await start_fronts(
        None, auth, host, grpc_port, None,
        lambda server: admin_pb2_grpc.add_AdminServicer_to_server(admin, server),
        select=directory.select, metrics=api_metrics(registry),
        frame_port=frame_port_setting())
    client = Etcd(etcd)
    agent = NodeAgent(client, me, open_shard, ControllerSettings(
        shards=shards, initial_nodes=initial_nodes, replace_after_s=replace_after_s),
        pace=network.beat)

    async def readiness() -> list[str]:
        if agent.map is None:
            return ["no partition map yet (joining the cluster)"]
        snapshot = agent.map.snapshot
        problems = [f"shard {s.shard_id}: placed here but not open yet"
                    for s in snapshot.shards.values()
                    if node_id in s.replicas and s.shard_id not in engines]
        for shard_id, engine in sorted(engines.items()):
            problems += replica_problems(shard_id, engine)
        return problems

    ops = await _open_ops(f"sqsq node {node_id}", host, metrics_port, registry, readiness)
    await network.start()  # before the agent opens any shard
    try:
        await agent.start()
    except EtcdError as exc:
        await network.stop()
        await fronts.stop()
        if ops is not None:
            await ops.stop()
        raise OSError(f"cannot join the cluster: etcd at {etcd}: {exc}") from None
    announce(f"sqsq node {node_id}: gRPC on {host}:{fronts.grpc_port}, Raft from "
             f"{me.raft_address}, etcd at {etcd}")
    announce_auth("sqsq node", auth)
    await until_signalled()
    log.info("shutting down")
    for engine in engines.values():
        engine.end_long_polls()
    await _hand_over(engines)
    await fronts.stop()
    if ops is not None:
        await ops.stop()
    await agent.close()
    await client.close()
    for engine in engines.values():
        await engine.stop()
    await network.stop()  # last: the hand-over and the stops still talk to peers
    announce(f"sqsq node {node_id}: stopped")


def _with_fast_handoff() -> None:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


def serve(
    data_dir: str = "./data", host: str = "127.0.0.1", grpc_port: int = DEFAULT_GRPC_PORT,
    http_port: int = DEFAULT_HTTP_PORT, sync: bool = True,
    credentials_file: str | None = None, region: str | None = None,
    account: str | None = None, public_url: str | None = None,
    metrics_port: int | None = None, log_format: str = "text",
) -> int:
    _with_fast_handoff()
    return run_process("sqsq server", run_server(
        data_dir, host, grpc_port, http_port, sync=sync, credentials_file=credentials_file,
        region=region, account=account, public_url=public_url, metrics_port=metrics_port),
        log_format)


def serve_node(log_format: str = "text", **kwargs: object) -> int:
    _with_fast_handoff()
    if kwargs.get("etcd"):
        kwargs.pop("peers", None)
        kwargs.pop("bootstrap", None)
        return run_process("sqsq node", run_cluster_node(**kwargs),  # type: ignore[arg-type]
                           log_format)
    for name in ("etcd", "node_id", "shards", "advertise", "replace_after_s", "initial_nodes",
                 "host_label"):
        kwargs.pop(name, None)
    return run_process("sqsq node", run_node(**kwargs), log_format)  # type: ignore[arg-type]

