"""The ``sqsq cluster`` commands: ``up`` (start and supervise a local cluster), ``status``,
``start-node`` (``sqsq.cli.supervisor``) and ``restart --rolling`` (``sqsq.cli.rolling``).
The cluster itself is ``sqsq.cli.cluster.LocalCluster``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from sqsq import admincred
from sqsq.cli import rolling
from sqsq.cli.cluster import LocalCluster
from sqsq.cli.clusterdir import LOOPBACK, ClusterDirError
from sqsq.cli.clusterstatus import read_status
from sqsq.cli.localprocs import port_taken

DEFAULT_GRPC_PORT = 7400  # the gateway's, as `sqsq server`'s
DEFAULT_HTTP_PORT = 9324
DEFAULT_ETCD_MEMBERS = 3  # the map stays available while one of them is down
DEFAULT_SHARDS = 4  # a new cluster shows sharding: queues land on different shards


# -- the commands ----------------------------------------------------------------------------

def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("cluster", help="run a local cluster, or show its state")
    sub = p.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="start etcd, the nodes and a gateway in the foreground")
    up.add_argument("--nodes", type=int, default=None,
                    help="how many nodes (at least 3; default 3, or the directory's)")
    up.add_argument("--shards", type=int, default=None,
                    help="how many shards (default 4, or the directory's)")
    up.add_argument("--partitions", type=int, default=None,
                    help="partitions of a new queue, each on its own shard (default 1, or "
                         "the directory's)")
    up.add_argument("--nodes-per-host", type=int, default=1,
                    help="nodes standing for one machine (their --host-label); no shard has "
                         "two replicas on one (default 1)")
    up.add_argument("--etcd-members", type=int, default=None, choices=(1, 3, 5),
                    help="etcd members holding the partition map (default 3, or the "
                         "directory's): a majority of them keeps it available")
    up.add_argument("--dir", type=Path, default=Path("./cluster"),
                    help="where data, logs and cluster.json go; a directory that holds a "
                         "cluster starts that cluster again")
    up.add_argument("--grpc-port", type=int, default=None,
                    help="the gateway's gRPC port (default 7400, or the directory's)")
    up.add_argument("--http-port", type=int, default=None,
                    help="the gateway's SQS HTTP port (default 9324, or the directory's)")
    up.add_argument("--restart", choices=("no", "on-failure"), default="no",
                    help="a process that dies: left down (default; `cluster start-node` "
                         "starts it) or started again after a back-off (1 s doubling to 30 s)")
    up.set_defaults(handler=cmd_up, needs_client=False)
    st = sub.add_parser("status", help="nodes, shards with their leaders, queues")
    st.add_argument("--dir", type=Path, default=Path("./cluster"),
                    help="the directory `cluster up` wrote cluster.json to")
    st.add_argument("--etcd", metavar="ENDPOINT", default=None,
                    help="read the cluster's etcd at host:port instead of --dir's cluster.json")
    st.add_argument("--json", dest="as_json", action="store_true", help="print JSON")
    st.add_argument("--replicas", action="store_true",
                    help="also ask each live node for its replicas' Raft progress")
    st.set_defaults(handler=cmd_status, needs_client=False)
    rs = sub.add_parser("restart", help="restart the nodes of a running `cluster up`")
    rs.add_argument("--rolling", action="store_true", required=True,
                    help="one node at a time, leaders last, each ready before the next")
    rs.add_argument("--dir", type=Path, default=Path("./cluster"),
                    help="the directory of the running `cluster up`")
    rs.set_defaults(handler=rolling.cmd_restart, needs_client=False)
    from sqsq.cli import supervisor

    supervisor.add_parser(sub)
    return p


def cmd_up(args: argparse.Namespace) -> int:
    from sqsq.cli.supervisor import Supervisor, running_supervisor, start_on_signal

    if args.nodes is not None and args.nodes < 3:
        print("sqsq cluster up: error: a shard has three replicas: --nodes must be at least 3",
              file=sys.stderr)
        return 2
    hosts = -(-(args.nodes or 3) // max(args.nodes_per_host, 1))
    if args.nodes_per_host < 1 or hosts < 3:
        print("sqsq cluster up: error: a shard's three replicas are on three hosts: "
              "--nodes / --nodes-per-host must make at least 3", file=sys.stderr)
        return 2
    if not 1 <= (args.shards or 1) <= 64 or (args.partitions or 1) < 1:
        print("sqsq cluster up: error: --shards is 1..64 and --partitions at least 1",
              file=sys.stderr)
        return 2
    pid = running_supervisor(args.dir)
    if pid is not None:
        print(f"sqsq cluster up: error: the cluster in {args.dir} is already running "
              f"(`sqsq cluster up`, pid {pid})", file=sys.stderr)
        return 1
    new = not (args.dir / "cluster.json").exists()  # a new one gets the usual ports
    try:
        cluster = LocalCluster(
            args.dir, nodes=args.nodes, shards=args.shards or (DEFAULT_SHARDS if new else None),
            partitions=args.partitions,
            etcd_members=args.etcd_members or (DEFAULT_ETCD_MEMBERS if new else None),
            nodes_per_host=args.nodes_per_host,
            gateway_grpc_port=args.grpc_port or (DEFAULT_GRPC_PORT if new else None),
            gateway_http_port=args.http_port or (DEFAULT_HTTP_PORT if new else None))
    except ClusterDirError as exc:
        print(f"sqsq cluster up: error: {exc}", file=sys.stderr)
        return 1
    again = cluster.layout is not None
    taken = port_taken(LOOPBACK, cluster.port_uses())
    if taken is not None:
        print(f"sqsq cluster up: error: {taken}", file=sys.stderr)
        return 1
    stop = _stop_on_signals()
    restart = rolling.restart_on_signal()
    start_asked = start_on_signal()
    cluster.supervisor_pid = os.getpid()
    try:
        cluster.start()
    except OSError as exc:
        print(f"sqsq cluster up: error: {exc} (logs in {cluster.root / 'logs'})",
              file=sys.stderr)
        return 1
    g = cluster.gateway
    print(f"sqsq cluster: {'started again: ' if again else ''}{len(cluster.nodes)} nodes "
          f"({', '.join(n.node_id for n in cluster.nodes)}), {cluster.shards} "
          f"shard{'s' if cluster.shards > 1 else ''} of three replicas; gateway gRPC on "
          f"{g.endpoint}, SQS HTTP API on {g.http_url}; etcd on "
          f"{cluster.etcd_endpoint}; {cluster.root / 'cluster.json'} written, logs in "
          f"{cluster.root / 'logs'}. A process that dies is reported and "
          f"{'started again' if args.restart == 'on-failure' else 'left down'}; "
          "Ctrl-C stops everything.", flush=True)
    supervisor = Supervisor(cluster, restart=args.restart == "on-failure")
    try:
        while not stop.wait(0.5):
            if restart.is_set():
                restart.clear()
                rolling.serve_restart(cluster)
            supervisor.check()  # a death is reported before a start-node for it is served
            if start_asked.is_set():
                start_asked.clear()
                supervisor.serve_start_request()
    finally:
        print("sqsq cluster: stopping", flush=True)
        cluster.stop()
        print("sqsq cluster: stopped", flush=True)
    return 0


def _stop_on_signals() -> Any:
    import threading

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def cmd_status(args: argparse.Namespace) -> int:
    path = args.dir / "cluster.json"
    admincred.use_directory(args.dir)  # --replicas asks the nodes' Admin API
    if args.etcd:
        where = f"the etcd at {args.etcd}"
    else:
        try:
            info = json.loads(path.read_text())
            args.etcd = ",".join(f"127.0.0.1:{e['client_port']}"
                                 for e in info.get("etcd_members") or [info["etcd"]])
        except FileNotFoundError:
            print(f"sqsq cluster status: error: there is no cluster in {args.dir} (no "
                  f"cluster.json; `sqsq cluster up --dir {args.dir}` starts one)",
                  file=sys.stderr)
            return 1
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"sqsq cluster status: error: {path}: {exc}", file=sys.stderr)
            return 1
        where = f"the cluster in {args.dir}"
    try:
        status = read_status(args.etcd, replicas=args.replicas)
    except Exception:  # noqa: BLE001 - etcd unreachable: say so in one line
        hint = "" if where.startswith("the etcd") else \
            f" (its etcd on {args.etcd} does not answer); start it with: sqsq cluster up " \
            f"--dir {args.dir}"
        print(f"sqsq cluster status: {where} is not running{hint}", file=sys.stderr)
        return 1
    if args.as_json:
        print(json.dumps(status, indent=2))
        return 0
    for n in status["nodes"]:
        leads = f", leads {len(n['leads'])} shard{'s' if len(n['leads']) != 1 else ''}" \
            if n["alive"] else ""
        busy = ", busy" if n["busy"] else ""
        print(f"node {n['id']}: {'alive' if n['alive'] else 'DOWN'} ({n['grpc']}, host "
              f"{n['host']}){leads}{busy}")
    for s in status["shards"]:
        print(f"shard {s['id']}: leader {s['leader'] or '-'}, replicas "
              f"{', '.join(s['replicas'])} (epoch {s['epoch']})")
    for q in status["queues"]:
        to = q.get("sends_to")
        sends = "" if to is None or len(q["partitions"]) == 1 else \
            f"; sends to partition{'s' if len(to) > 1 else ''} {', '.join(map(str, to))}"
        print(f"queue {q['name']}: partitions on shards "
              f"{', '.join(str(p) for p in q['partitions'])}{sends}")
    return 0
