"""Shard replicas built from a backup (``sqsq backup`` writes one, ``sqsq restore`` reads it).

A backup directory holds, for each shard, the files of a RocksDB checkpoint its leader took
after a barrier (``shard-<id>/``), the receipt-handle secret (``secret``), for a cluster the
shard and queue records of its partition map (``partition-map.json``), and ``manifest.json``,
written last: a backup without one is incomplete. The manifest lists every file with its size
and SHA-256, which a restore checks before it trusts a byte.

**How a restored replica starts.** A checkpoint is the state machine's store, whose ``Meta``
records the Raft index of the last entry applied to it (``applied_index``), so that entries
replayed from the Raft log after a restart are skipped. A restored shard has no log: it is a
new Raft group (new members, new addresses), whose log starts empty. Every replica of the
shard is therefore given the same checkpoint with its applied index set back to 0: each
starts from the same state with the same empty log, which is a sound start for a group (all
members agree on every index, and on the state before the first one). The index is the Raft
log's position and nothing else in the state refers to it (records, receipt handles, fencing
and sequence numbers are counters of their own, restored as they were). The replica's
``member`` file is written too: it forms the group from its first start (it is not a wiped
replica that must learn the group from a leader).

The secret is restored with the data: receipt handles are signed with it, so handles given
out before the backup still delete their messages, and the store records a fingerprint of
(secret, region, account) that a replica checks when it opens (``ShardMachine``). FIFO
deduplication windows and everything else the queues hold are in the store itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqsq.core import keys, records
from sqsq.core.state import ShardConfig
from sqsq.shard.durable import fsync_path
from sqsq.shard.replica import MEMBER_FILE
from sqsq.shard.store import RocksStore

FORMAT = "sqsq-backup-1"
MANIFEST = "manifest.json"
SECRET = "secret"
PARTITION_MAP = "partition-map.json"


class RestoreError(Exception):
    """A backup that cannot be restored, or a target that must not be written to."""


@dataclass(frozen=True)
class ShardBackup:
    shard_id: int
    directory: Path
    applied_index: int
    snapshot_ms: int
    files: dict[str, dict[str, Any]]  # name -> {"size", "sha256"}


@dataclass(frozen=True)
class Backup:
    root: Path
    kind: str  # "server" or "cluster"
    region: str
    account: str
    secret: bytes
    shards: list[ShardBackup]
    map_records: list[tuple[str, bytes]]  # (etcd key, record), a cluster's only

    def config(self, shard_id: int) -> ShardConfig:
        return ShardConfig(shard_id=shard_id, secret=self.secret, region=self.region,
                           account=self.account)


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    """``manifest.json``, durably and last: its presence says the backup is complete."""
    tmp = root / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MANIFEST)
    fsync_path(root, directory=True)


def load_backup(root: Path) -> Backup:
    """The backup at ``root``, its manifest checked (not yet its files' contents)."""
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        raise RestoreError(f"{root}: no {MANIFEST}: not a backup, or an incomplete one "
                           f"(the manifest is written last)") from None
    except ValueError as exc:
        raise RestoreError(f"{root / MANIFEST}: not JSON: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise RestoreError(f"{root}: backup format {manifest.get('format')!r}, this sqsq "
                           f"reads {FORMAT!r}")
    try:
        secret = (root / SECRET).read_bytes()
        records_ = []
        if manifest["kind"] == "cluster":
            raw = json.loads((root / PARTITION_MAP).read_text())
            records_ = [(r["key"], json.dumps(r["value"], separators=(",", ":"),
                                              sort_keys=True).encode()) for r in raw]
        shards = [ShardBackup(s["shard_id"], root / s["dir"], s["applied_index"],
                              s["snapshot_ms"], s["files"]) for s in manifest["shards"]]
        backup = Backup(root, manifest["kind"], manifest["region"], manifest["account"],
                        secret, sorted(shards, key=lambda s: s.shard_id), records_)
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise RestoreError(f"{root}: a damaged backup: {exc!r}") from None
    if hashlib.sha256(secret).hexdigest() != manifest.get("secret_sha256"):
        raise RestoreError(f"{root / SECRET}: not the secret this backup was taken with")
    return backup


def restore_replica(backup: Backup, shard: ShardBackup, directory: Path) -> None:
    """Shard ``shard``'s replica directory at ``directory`` (which must not exist): the
    checkpoint, verified, as its store (applied index 0, see the module doc), and ``member``.
    """
    if directory.exists():
        raise RestoreError(f"{directory} exists: a restore never overwrites a replica")
    staging = directory.with_name(directory.name + ".restoring")
    shutil.rmtree(staging, ignore_errors=True)
    db = staging / "db"
    db.mkdir(parents=True)
    for name, want in sorted(shard.files.items()):
        source, target = shard.directory / name, db / name
        if not source.resolve().is_relative_to(shard.directory.resolve()):
            raise RestoreError(f"{source}: outside the backup")
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        with open(source, "rb") as src, open(target, "wb") as dst:
            while block := src.read(1 << 20):
                digest.update(block)
                dst.write(block)
            dst.flush()
            os.fsync(dst.fileno())
        if digest.hexdigest() != want["sha256"] or target.stat().st_size != want["size"]:
            raise RestoreError(f"{source}: its contents differ from the manifest's")
    _reset_store(db, backup.config(shard.shard_id))
    _write_file(staging / MEMBER_FILE, b"restored\n")
    for dirpath, _, _ in os.walk(staging):
        fsync_path(dirpath, directory=True)
    directory.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, directory)
    fsync_path(directory.parent, directory=True)


def _reset_store(db: Path, config: ShardConfig) -> None:
    """Check the checkpoint belongs to this secret, region and account; set its applied
    index back to 0 for the new group's log (durably: the write-ahead log is synced)."""
    store = RocksStore(str(db))
    try:
        recorded = store.get(keys.CONFIG_KEY)
        if recorded is not None and recorded.decode() != config.fingerprint():
            raise RestoreError(f"shard {config.shard_id}: the checkpoint was written under "
                               f"another secret, region or account than the backup records")
        meta = records.Meta.decode(store.get(keys.META_KEY))
        meta.applied_index = 0
        store.write({keys.META_KEY: meta.encode()}, sync=True)
    finally:
        store.close()


def write_secret(path: Path, secret: bytes) -> None:
    """The receipt-handle secret at ``path`` (mode 0600, fsynced); an existing different one
    is an error (it would make the restored handles and fingerprint wrong)."""
    if path.exists():
        if path.read_bytes() != secret:
            raise RestoreError(f"{path} exists and holds another secret")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_file(path, secret, mode=0o600)


def _write_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent, directory=True)


def restore_server(backup: Backup, data_dir: Path) -> None:
    """A ``sqsq server`` data directory (its one shard, shard 0, and its secret)."""
    if len(backup.shards) != 1 or backup.shards[0].shard_id != 0:
        raise RestoreError(f"a single server has one shard; this backup has "
                           f"{len(backup.shards)} (restore it into a cluster)")
    if (data_dir / "shard-0").exists():
        raise RestoreError(f"{data_dir} already holds a server's data")
    write_secret(data_dir / SECRET, backup.secret)
    restore_replica(backup, backup.shards[0], data_dir / "shard-0")
