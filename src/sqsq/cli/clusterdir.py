"""A local cluster's directory: what its ``cluster.json`` records (each process's identity and
ports, checked on reading, written whole) and the records of the processes themselves.
``sqsq.cli.cluster.LocalCluster`` starts and stops them."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqsq.cli.localprocs import free_port

LOOPBACK = "127.0.0.1"


@dataclass
class NodeProcess:
    node_id: str
    root: Path
    grpc_port: int
    raft_port: int
    proc: subprocess.Popen | None = None
    host: str = LOOPBACK
    metrics_port: int = field(default_factory=free_port)  # /metrics, /healthz, /readyz
    host_label: str = ""  # the machine it stands for (--host-label): replicas go to others

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class GatewayProcess:
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    host: str = LOOPBACK
    metrics_port: int = field(default_factory=free_port)

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"


class ClusterDirError(OSError):
    """A ``--dir`` that cannot be started: half-written, another version's, or in use."""


#: What ``cluster.json`` looks like; a directory written in another format is refused, not
#: guessed at (its ports and node ids are what the partition map and Raft groups remember).
LAYOUT_FORMAT = 1


def read_layout(root: Path) -> dict[str, Any] | None:
    """The cluster a directory holds (its ``cluster.json``), or None for a new one;
    ``ClusterDirError`` for a directory that cannot be started again as it is."""
    path = root / "cluster.json"
    if not path.exists():
        if (root / "etcd").exists() or (root / "etcd1").exists():
            raise ClusterDirError(
                f"{root} has etcd data but no cluster.json: a half-written cluster whose "
                "node ids and ports are lost; remove it or use another --dir")
        return None
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ClusterDirError(f"{path} is half-written or damaged ({exc}); remove {root} "
                              "or use another --dir") from None
    if not isinstance(info, dict) or info.get("format") != LAYOUT_FORMAT:
        found = info.get("format") if isinstance(info, dict) else None
        raise ClusterDirError(
            f"{path} was written by another version of sqsq (cluster directory format "
            f"{found!r}, this one starts format {LAYOUT_FORMAT}): start it with that version, "
            "or use another --dir")
    try:
        for n in info["nodes"]:
            n["id"], n["grpc_port"], n["raft_port"], n["metrics_port"]  # noqa: B018
        for e in info.get("etcd_members") or [info["etcd"]]:
            e["client_port"], e["peer_port"]  # noqa: B018
        info["gateway"]["grpc_port"], info["gateway"]["http_port"]  # noqa: B018
        info["gateway"]["metrics_port"], info["shards"], info["partitions"]  # noqa: B018
    except (KeyError, TypeError) as exc:
        raise ClusterDirError(f"{path} is half-written or damaged (no {exc}); remove "
                              f"{root} or use another --dir") from None
    return info


def write_layout(root: Path, layout: dict[str, Any]) -> Path:
    """``layout`` (with this format's number) as ``root``'s ``cluster.json``, replaced whole:
    a reader never sees half of it."""
    path = root / "cluster.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"format": LAYOUT_FORMAT, **layout}, indent=2) + "\n")
    os.replace(tmp, path)
    return path
