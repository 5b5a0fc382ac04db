"""``sqsq backup`` and ``sqsq restore``: a consistent copy of every shard, and new data from it.

    sqsq backup --endpoint 127.0.0.1:7400 --out ./backup-1      # a server, or a cluster's gateway
    sqsq restore --from ./backup-1 --data-dir ./data            # a single server's data
    sqsq restore --from ./backup-1 --cluster-dir ./cluster2     # for `sqsq cluster up --dir`

The backup asks the endpoint for a checkpoint of every shard (each taken by the shard's
leader after a barrier, so it holds everything acknowledged before the call), streams the
checkpoints' files over the Admin API (``ReadSnapshot``: the backup is written where this
command runs, not on the server's machine), and releases them. With them it saves the
receipt-handle secret and, from a cluster's gateway, the partition map's shard and queue
records. The Admin API wants the admin credential (``sqsq.admincred``): ``--admin-token
FILE`` (the server's ``DATA_DIR/admin-token``, or the cluster directory's), else env
``SQSQ_ADMIN_TOKEN`` / ``SQSQ_ADMIN_TOKEN_FILE``. Each shard's checkpoint is its own point in
time (shards are independent: no message is in two), taken one after the other within the
call. ``manifest.json`` is written
last; see ``sqsq.shard.restore`` for the format and for how a restored replica starts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import grpc

CALL_TIMEOUT_S = 120.0


class BackupError(Exception):
    pass


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    b = subparsers.add_parser(
        "backup", help="copy every shard's state (and the partition map) to a directory",
        description="Write a consistent snapshot of every shard of a running server or "
        "cluster (through its gateway) to --out, streamed over the Admin API.")
    # its own dest: the main parser's global --endpoint has a default, this one must be given
    b.add_argument("--endpoint", dest="backup_endpoint", required=True, metavar="HOST:PORT",
                   help="gRPC address of a running server, or of a cluster's gateway")
    b.add_argument("--out", required=True, type=Path,
                   help="directory to write (must not exist, or be empty)")
    b.add_argument("--admin-token", type=Path, default=None, metavar="FILE",
                   help="the admin credential: the server's DATA_DIR/admin-token or the "
                   "cluster directory's (default: env SQSQ_ADMIN_TOKEN or "
                   "SQSQ_ADMIN_TOKEN_FILE)")
    b.set_defaults(handler=run_backup, needs_client=False)
    r = subparsers.add_parser(
        "restore", help="build a server's or a cluster's data from a backup",
        description="Write new data directories from a backup made by `sqsq backup`: a "
        "single server's (--data-dir), or a local cluster's (--cluster-dir, then `sqsq "
        "cluster up --dir` with the same --shards). Nothing existing is overwritten.")
    r.add_argument("--from", dest="source", required=True, type=Path, help="the backup")
    target = r.add_mutually_exclusive_group(required=True)
    target.add_argument("--data-dir", type=Path, help="a new `sqsq server` data directory")
    target.add_argument("--cluster-dir", type=Path,
                        help="a new directory for `sqsq cluster up --dir` (its node data, "
                        "secret, and the partition map to load into its etcd)")
    r.add_argument("--nodes", type=int, default=3,
                   help="with --cluster-dir: the nodes `cluster up --nodes` will start")
    r.set_defaults(handler=run_restore, needs_client=False)


# -- backup ----------------------------------------------------------------------------------

def admin_channel(endpoint: str, credentials: tuple[str, str] | None = None,
                  admin_key: bytes | None = None) -> grpc.Channel:
    """A blocking channel for Admin calls, signed when credentials are given or in the env,
    each call proving the admin credential (``admin_key``, else the env's)."""
    from sqsq import admincred
    from sqsq.client import _auth

    return admincred.signing(_auth.signed_channel(endpoint, _auth.resolve(credentials)),
                             admin_key)


def take_backup(endpoint: str, out: Path, *,
                credentials: tuple[str, str] | None = None,
                admin_key: bytes | None = None) -> dict[str, Any]:
    """Back up the server or cluster at ``endpoint`` into ``out``; the manifest written."""
    from sqsq.shard import restore
    from sqsq.v1 import admin_pb2 as pb
    from sqsq.v1 import admin_pb2_grpc as pb_grpc

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BackupError(f"{out} exists and is not an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    with admin_channel(endpoint, credentials, admin_key) as channel:
        admin = pb_grpc.AdminStub(channel)
        try:
            made = admin.CreateSnapshot(pb.CreateSnapshotRequest(), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as err:
            raise BackupError(f"{endpoint}: CreateSnapshot: {_rpc_message(err)}") from None
        snapshots = sorted(made.snapshots, key=lambda s: s.shard_id)
        try:
            if not snapshots:
                raise BackupError(f"{endpoint} made no snapshot (it leads no shard)")
            secret: bytes | None = None
            shards = []
            for snap in snapshots:
                files, got = _fetch(admin, snap.path, out / f"shard-{snap.shard_id}",
                                    include_secret=secret is None)
                secret = secret or got
                shards.append({"shard_id": snap.shard_id, "dir": f"shard-{snap.shard_id}",
                               "applied_index": snap.applied_index,
                               "snapshot_ms": snap.snapshot_ms, "files": files})
            # After the checkpoints: every queue they hold was created before this read.
            pmap = admin.ReadPartitionMap(pb.ReadPartitionMapRequest(), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as err:
            raise BackupError(f"{endpoint}: {_rpc_message(err)}") from None
        finally:
            for snap in snapshots:
                try:
                    admin.DeleteSnapshot(pb.DeleteSnapshotRequest(path=snap.path),
                                         timeout=CALL_TIMEOUT_S)
                except grpc.RpcError as err:
                    print(f"warning: {snap.path} not released: {_rpc_message(err)}",
                          file=sys.stderr)
    if not secret:
        raise BackupError(f"{endpoint} sent no receipt-handle secret")
    restore.write_secret(out / restore.SECRET, secret)
    kind = "cluster" if pmap.cluster else "server"
    if pmap.cluster:
        records = [{"key": r.key, "value": json.loads(r.value)} for r in pmap.records]
        (out / restore.PARTITION_MAP).write_text(json.dumps(records, indent=2) + "\n")
    manifest = {
        "format": restore.FORMAT, "kind": kind, "endpoint": endpoint,
        "created_ms": int(time.time() * 1000), "region": snapshots[0].region,
        "account": snapshots[0].account,
        "secret_sha256": hashlib.sha256(secret).hexdigest(), "shards": shards,
    }
    restore.write_manifest(out, manifest)
    return manifest


def _fetch(admin: Any, path: str, target: Path, *, include_secret: bool
           ) -> tuple[dict[str, dict[str, Any]], bytes | None]:
    """Stream snapshot ``path`` into ``target``: ({name: size and sha256}, the secret)."""
    from sqsq.v1 import admin_pb2 as pb

    target.mkdir(parents=True)
    root = target.resolve()
    files: dict[str, dict[str, Any]] = {}
    secret = None
    current: tuple[str, Any, Any] | None = None  # name, open file, running digest

    def finish() -> None:
        if current is None:
            return
        name, f, digest = current
        f.flush()
        os.fsync(f.fileno())
        f.close()
        files[name]["sha256"] = digest.hexdigest()
        if (root / name).stat().st_size != files[name]["size"]:
            raise BackupError(f"{path}/{name}: the stream ended short of the file's size")

    for chunk in admin.ReadSnapshot(pb.ReadSnapshotRequest(path=path,
                                                           include_secret=include_secret)):
        if chunk.secret:
            secret = chunk.secret
        if not chunk.name:
            continue
        if current is None or current[0] != chunk.name:
            finish()
            dest = (root / chunk.name).resolve()
            if not dest.is_relative_to(root) or chunk.name in files or chunk.offset:
                raise BackupError(f"{path}: the server sent a bad file entry {chunk.name!r}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            files[chunk.name] = {"size": chunk.size}
            current = (chunk.name, open(dest, "wb"), hashlib.sha256())  # noqa: SIM115
        name, f, digest = current
        if chunk.offset != f.tell():
            raise BackupError(f"{path}/{name}: chunks out of order")
        f.write(chunk.data)
        digest.update(chunk.data)
    finish()
    for dirpath, _, _ in os.walk(root):
        fd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    if not files:
        raise BackupError(f"{path}: an empty snapshot")
    return files, secret


def _rpc_message(err: grpc.RpcError) -> str:
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    return f"{code.name if code else 'error'}: {details}"


def run_backup(args: argparse.Namespace) -> int:
    from sqsq import admincred

    try:
        key = admincred.check_length(args.admin_token.read_bytes().strip(), args.admin_token,
                                     "admin credential") if args.admin_token else None
        manifest = take_backup(args.backup_endpoint, args.out, admin_key=key)
    except (BackupError, OSError, ValueError) as exc:
        print(f"sqsq backup: error: {exc}", file=sys.stderr)
        return 1
    for s in manifest["shards"]:
        size = sum(f["size"] for f in s["files"].values())
        print(f"shard {s['shard_id']}: applied index {s['applied_index']}, {len(s['files'])} "
              f"files, {size} bytes")
    print(f"{manifest['kind']} backup written to {args.out}")
    return 0


# -- restore ---------------------------------------------------------------------------------

def restore_cluster_dir(backup: Any, cluster_dir: Path, nodes: int) -> dict[str, list[str]]:
    """Data for ``sqsq cluster up --dir cluster_dir --nodes nodes`` (node ids n1..nN, as
    ``LocalCluster`` names them): each shard's replicas, the secret, and the seed of the new
    etcd (``LocalCluster.SEED``: shard records at epoch 1 naming the nodes given the data,
    and the queue records). Returns shard id -> the node ids holding it."""
    from sqsq.cli.cluster import SEED_FILE
    from sqsq.control import keys
    from sqsq.shard import restore

    if backup.kind != "cluster":
        raise restore.RestoreError("this is a single server's backup: restore it with "
                                   "--data-dir")
    if nodes < keys.REPLICATION_FACTOR:
        raise restore.RestoreError(f"a shard has {keys.REPLICATION_FACTOR} replicas: "
                                   f"--nodes must be at least that")
    node_ids = [f"n{i + 1}" for i in range(nodes)]
    taken = [p for p in [cluster_dir / SEED_FILE, cluster_dir / "etcd",
                         *(cluster_dir / n for n in node_ids)] if p.exists()]
    if taken:
        raise restore.RestoreError(f"{taken[0]} exists: restore into a new directory")
    old = {}
    for key, value in backup.map_records:
        if key.startswith(keys.SHARDS):
            shard = keys.decode(key, value)
            old[shard.shard_id] = shard.replicas
    placed: dict[str, list[str]] = {}
    for shard in backup.shards:
        replicas = list(old.get(shard.shard_id, ()))
        if len(replicas) != keys.REPLICATION_FACTOR or not set(replicas) <= set(node_ids):
            replicas = [node_ids[(shard.shard_id + i) % nodes]
                        for i in range(keys.REPLICATION_FACTOR)]
        for node_id in replicas:
            restore.restore_replica(backup, shard, cluster_dir / node_id
                                    / f"shard-{shard.shard_id}")
        placed[str(shard.shard_id)] = replicas
    restore.write_secret(cluster_dir / "secret", backup.secret)
    seed = [{"key": keys.shard_key(int(s)), "value": json.loads(keys.encode(
        keys.ShardRecord(int(s), tuple(r), 1)))} for s, r in placed.items()]
    seed += [{"key": k, "value": json.loads(v)} for k, v in backup.map_records
             if k.startswith(keys.QUEUES)]
    tmp = cluster_dir / (SEED_FILE + ".tmp")
    tmp.write_text(json.dumps({"shards": len(placed), "records": seed}, indent=2) + "\n")
    os.replace(tmp, cluster_dir / SEED_FILE)
    return placed


def run_restore(args: argparse.Namespace) -> int:
    from sqsq.shard import restore

    try:
        backup = restore.load_backup(args.source)
        if args.data_dir is not None:
            restore.restore_server(backup, args.data_dir)
            where = f"sqsq server --data-dir {args.data_dir}"
        else:
            restore_cluster_dir(backup, args.cluster_dir, args.nodes)
            where = (f"sqsq cluster up --dir {args.cluster_dir} --nodes {args.nodes} "
                     f"--shards {len(backup.shards)}")
    except (restore.RestoreError, OSError) as exc:
        print(f"sqsq restore: error: {exc}", file=sys.stderr)
        return 1
    # the nodes or server must run with the region and account the state was written in
    if args.data_dir is not None:
        where += f" --region {backup.region} --account {backup.account}"
    else:
        where += f" (region {backup.region}, account {backup.account})"
    print(f"restored {len(backup.shards)} shard(s) from {args.source}; start it with: {where}")
    return 0
