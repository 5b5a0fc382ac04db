"""``sqsq export``: point-in-time shard snapshots written as Parquet datasets.

Two ways in, one way out:
- a running server (``--endpoint``): its Admin.CreateSnapshot makes a checkpoint per shard
  while writes go on; we read the checkpoints (same machine) and release them. A cluster's
  gateway (``sqsq gateway --etcd``) answers it with a checkpoint of every shard, each from
  its leader, under the cluster's shard ids;
- the data directory of a stopped server (``--data-dir``): we open each shard store, take a
  checkpoint and read that. A running server holds the RocksDB lock; that is an error that
  points at ``--endpoint``.
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from sqsq import admincred
from sqsq.analytics import extract
from sqsq.analytics.parquet import PartWriter, record_snapshot
from sqsq.core.state import ShardConfig
from sqsq.gateway.auth import ERROR_CODE_KEY
from sqsq.shard.store import MemoryStore, RocksStore
from sqsq.v1 import admin_pb2, admin_pb2_grpc


class ExportError(Exception):
    """An export that cannot run, with a message meant for the operator."""


@dataclass(frozen=True)
class Checkpoint:
    """One shard's checkpoint to read, as of ``snapshot_ms``."""

    shard: int
    path: Path
    snapshot_ms: int
    region: str = ShardConfig.region
    account: str = ShardConfig.account


def _open(path: Path) -> RocksStore | MemoryStore:
    return RocksStore(str(path)) if path.is_dir() else MemoryStore.load(str(path))


def export_checkpoints(
    checkpoints: Sequence[Checkpoint], out: Path, *, include_bodies: bool = False,
    source: str = "", partition: int = 0,
) -> dict[str, Any]:
    """Write every checkpoint's rows under one snapshot time; returns the manifest entry.

    The partition directory uses the latest shard time (one name for the whole export); each
    row's ``as_of_ms`` is its own shard's time, which states and ages are computed against.
    """
    if not checkpoints:
        raise ExportError("nothing to export: no shards found")
    out.mkdir(parents=True, exist_ok=True)
    snapshot_ms = max(c.snapshot_ms for c in checkpoints)
    shards = []
    for cp in sorted(checkpoints, key=lambda c: c.shard):
        store = _open(cp.path)
        try:
            shards.append(_export_shard(store, cp, out, snapshot_ms, include_bodies, partition))
        finally:
            store.close()
    entry = {
        "snapshot_ms": snapshot_ms, "source": source, "include_bodies": include_bodies,
        "exported_at_ms": time.time_ns() // 1_000_000, "shards": shards,
    }
    record_snapshot(out, entry)
    return entry


def _export_shard(
    store: RocksStore | MemoryStore, cp: Checkpoint, out: Path, snapshot_ms: int,
    include_bodies: bool, partition: int,
) -> dict[str, Any]:
    probe = extract.SnapshotSource(store, cp.shard, cp.snapshot_ms)
    meta = extract.read_meta(probe)
    # never evaluate state before the last stamped command in the checkpoint
    as_of_ms = max(cp.snapshot_ms, meta.last_now_ms)
    src = extract.SnapshotSource(store, cp.shard, as_of_ms, cp.region, cp.account, include_bodies)
    stats = extract.ShardStats(applied_index=meta.applied_index, last_now_ms=meta.last_now_ms)
    queues = extract.queues_by_qid(src)
    writers = {name: PartWriter(out, name, snapshot_ms, cp.shard)
               for name in ("queues", "messages", "delivery")}
    try:
        writers["queues"].extend(extract.queue_rows(src, queues))
        for message, delivery in extract.message_and_delivery_rows(src, queues, stats, partition):
            writers["messages"].add(message)
            writers["delivery"].add(delivery)
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    for w in writers.values():
        w.close()
    stats.queues = len(queues)
    return {
        "shard": cp.shard, "as_of_ms": as_of_ms, "applied_index": stats.applied_index,
        "queues": stats.queues, "messages": stats.messages, "expired_left_out": stats.expired,
        "states": stats.states,
        "files": {name: str(w.path.relative_to(out)) for name, w in writers.items()},
    }


# ---- from a stopped server's data directory ------------------------------------------------


def shard_dirs(data_dir: Path) -> list[tuple[int, Path]]:
    """``shard-<n>`` stores under a data directory, by shard id."""
    found = []
    for p in data_dir.glob("shard-*"):
        suffix = p.name.removeprefix("shard-")
        if p.is_dir() and suffix.isdigit():
            found.append((int(suffix), p))
    return sorted(found)


def export_data_dir(
    data_dir: Path, out: Path, *, include_bodies: bool = False,
    clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
) -> dict[str, Any]:
    shards = shard_dirs(data_dir)
    if not shards:
        raise ExportError(f"{data_dir} holds no shard-<n> store: not an sqsq data directory")
    # checkpoints go next to the stores: hard links need the same filesystem
    work = data_dir / "snapshots" / f"export-{secrets.token_hex(4)}"
    checkpoints = []
    try:
        for shard, path in shards:
            try:
                # A replica keeps its store in db/ beside its Raft journal.
                store = RocksStore(str(path / "db" if (path / "db").is_dir() else path))
            except Exception as exc:  # rocksdict raises a bare Exception for the LOCK file
                if "lock" in str(exc).lower():
                    raise ExportError(
                        f"{path} is in use by a running server; export through it with "
                        "--endpoint HOST:PORT instead of --data-dir") from None
                raise
            try:
                cp_path = work / f"shard-{shard}"
                cp_path.parent.mkdir(parents=True, exist_ok=True)
                store.checkpoint(str(cp_path))
            finally:
                store.close()
            checkpoints.append(Checkpoint(shard, cp_path, clock_ms()))
        return export_checkpoints(checkpoints, out, include_bodies=include_bodies,
                                  source=f"data-dir {data_dir.resolve()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---- from a running server ------------------------------------------------------------------


def export_endpoint(
    endpoint: str, out: Path, *, include_bodies: bool = False, timeout_s: float = 60.0,
) -> dict[str, Any]:
    target = endpoint.removeprefix("http://").removeprefix("grpc://")
    # the Admin API wants the admin credential (env SQSQ_ADMIN_TOKEN / _FILE)
    with admincred.signing(grpc.insecure_channel(target)) as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        try:
            resp = admin.CreateSnapshot(admin_pb2.CreateSnapshotRequest(), timeout=timeout_s)
        except grpc.RpcError as err:
            raise ExportError(_rpc_message(target, err)) from None
        try:
            if not resp.snapshots:
                raise ExportError(
                    f"the server at {target} leads no shard: export through the shard's "
                    "leader, or through a cluster's gateway (sqsq gateway --etcd)")
            checkpoints = [
                Checkpoint(s.shard_id, Path(s.path), s.snapshot_ms, s.region, s.account)
                for s in resp.snapshots
            ]
            for cp in checkpoints:
                if not cp.path.exists():
                    raise ExportError(
                        f"snapshot {cp.path} is not visible here: export must run on the "
                        "server's machine (or a host sharing its filesystem)")
            return export_checkpoints(checkpoints, out, include_bodies=include_bodies,
                                      source=f"endpoint {target}")
        finally:
            for s in resp.snapshots:
                try:
                    admin.DeleteSnapshot(admin_pb2.DeleteSnapshotRequest(path=s.path),
                                         timeout=timeout_s)
                except grpc.RpcError:
                    pass  # the export stands; a leftover checkpoint is only disk space


def _rpc_message(target: str, err: grpc.RpcError) -> str:
    code = err.code() if hasattr(err, "code") else None
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    answered = any(key == ERROR_CODE_KEY for key, _ in trailing or ())
    if code == grpc.StatusCode.UNAVAILABLE and not answered:
        return f"no sqsq server answers at {target}"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return f"the server at {target} does not serve the Admin API (sqsq.v1.Admin)"
    detail = err.details() if hasattr(err, "details") else str(err)
    return f"CreateSnapshot failed at {target}: {detail}"
