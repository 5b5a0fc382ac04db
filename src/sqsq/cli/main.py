"""The ``sqsq`` command: run a server, manage queues, send and receive from the shell.

    sqsq server --data-dir ./data
    sqsq queue create jobs --attr VisibilityTimeout=60
    sqsq send jobs "hello"
    sqsq receive jobs -n 10 --wait 5 --delete

Errors print ``error: <Code>: <message>`` to stderr (with --json, ``{"Error": {"Code": ...,
"Message": ...}}``) and exit 1. JSON output uses SQS's key names (``MessageId``, ``MD5OfBody``).
The queue and message commands are in ``sqsq.cli.queuecmd``, the cluster's in
``sqsq.cli.clustercmd``; the processes are composed in ``sqsq.cli.server`` (server, node) and
``sqsq.gateway.server`` (gateway).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from sqsq.cli import backup as backup_cli
from sqsq.cli import clustercmd as cluster_cli
from sqsq.cli import export as export_cli
from sqsq.cli import queuecmd as queue_cli
from sqsq.client import Client
from sqsq.errors import QueueError, ServiceUnavailable

DEFAULT_ENDPOINT = "127.0.0.1:7400"


def _port(text: str) -> int:
    """A TCP port for argparse: 0 (any free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range (0-65535)")
    return port


def _ops_flags(p: argparse.ArgumentParser) -> None:
    """What every server process (server, node, gateway) takes for operations."""
    p.add_argument("--metrics-port", type=_port, default=None,
                   help="serve Prometheus /metrics, /healthz and /readyz on this port of "
                        "--host (default: off; 0: any free port)")
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="log lines as text (default) or one JSON object per line")


# -- handlers ------------------------------------------------------------------------------


def _ports_taken(name: str, host: str, ports: list[tuple[int, str]],
                 args: argparse.Namespace) -> bool:
    """Whether one of a server process's ports (with its metrics and frame ports) is in
    use; if so, says which in one line (``localprocs.port_taken``)."""
    from sqsq.cli.localprocs import port_taken

    frame = os.environ.get("SQSQ_FRAME_PORT", "")
    ports = [*ports, (args.metrics_port or 0, "metrics and health"),
             (int(frame) if frame.isdigit() else 0, "frame connections")]
    taken = port_taken(host, ports)
    if taken is not None:
        print(f"{name}: error: {taken}", file=sys.stderr)
    return taken is not None


def cmd_server(args: argparse.Namespace) -> int:
    from sqsq.cli.server import serve  # lazy: the CLI's client commands need no server code

    if _ports_taken("sqsq server", args.host, [(args.grpc_port, "gRPC"),
                                               (args.http_port, "SQS HTTP")], args):
        return 1
    try:
        result = serve(
            data_dir=args.data_dir, host=args.host, grpc_port=args.grpc_port,
            http_port=args.http_port, sync=not args.no_fsync, credentials_file=args.credentials,
            region=args.region, account=args.account, public_url=args.public_url,
            metrics_port=args.metrics_port, log_format=args.log_format,
        )
    except Exception as e:  # one line for what a user can fix, a traceback for the rest
        if "LOCK" in str(e) and "temporarily unavailable" in str(e):
            print(f"sqsq server: error: data dir {args.data_dir} is in use by another sqsq "
                  "server (its lock is held); stop that one or pass another --data-dir",
                  file=sys.stderr)
            return 1
        raise
    return int(result or 0)


def cmd_node(args: argparse.Namespace) -> int:
    from sqsq.cli.server import serve_node  # lazy, like the server

    if (args.peers is None) == (args.etcd is None):
        print("sqsq node: error: give either --etcd (a cluster's node) or --peers (one "
              "group of static members)", file=sys.stderr)
        return 2
    if args.etcd is not None and not args.node_id:
        print("sqsq node: error: --etcd needs --node-id", file=sys.stderr)
        return 2
    # One Raft port carries every shard's traffic (the peer transport).
    raft = [(args.raft_port, "Raft")]
    if _ports_taken("sqsq node", args.host, [(args.grpc_port, "gRPC"), *raft], args):
        return 1
    return serve_node(
        data_dir=args.data_dir, host=args.host, grpc_port=args.grpc_port,
        raft_port=args.raft_port, peers=args.peers, bootstrap=args.bootstrap,
        etcd=args.etcd, node_id=args.node_id, shards=args.shards, advertise=args.advertise,
        host_label=args.host_label,
        replace_after_s=args.replace_after, initial_nodes=args.initial_nodes,
        sync=not args.no_fsync, secret_file=args.secret_file,
        credentials_file=args.credentials, region=args.region, account=args.account,
        compaction_min_entries=args.compaction_entries, metrics_port=args.metrics_port,
        log_format=args.log_format)


def cmd_gateway(args: argparse.Namespace) -> int:
    from sqsq.gateway.server import serve_gateway  # lazy, like the server

    if (args.backend is None) == (args.etcd is None):
        print("sqsq gateway: error: give either --etcd (route over a cluster) or --backend "
              "(one node)", file=sys.stderr)
        return 2
    if _ports_taken("sqsq gateway", args.host, [(args.grpc_port, "gRPC"),
                                                 (args.http_port, "SQS HTTP")], args):
        return 1
    return serve_gateway(
        backend=args.backend, etcd=args.etcd, partitions=args.partitions, host=args.host,
        grpc_port=args.grpc_port,
        http_port=args.http_port, credentials_file=args.credentials, account=args.account,
        region=args.region, public_url=args.public_url, metrics_port=args.metrics_port,
        log_format=args.log_format)


# -- parser --------------------------------------------------------------------------------


def _common(suppress: bool) -> argparse.ArgumentParser:
    """--endpoint / --json, accepted before or after the subcommand."""
    parser = argparse.ArgumentParser(add_help=False)
    default_endpoint = os.environ.get("SQSQ_ENDPOINT") or DEFAULT_ENDPOINT
    parser.add_argument(
        "--endpoint",
        default=argparse.SUPPRESS if suppress else default_endpoint,
        help=f"server gRPC address host:port (env SQSQ_ENDPOINT, default {DEFAULT_ENDPOINT})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="machine-readable JSON output",
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    common = _common(suppress=True)
    parser = argparse.ArgumentParser(
        prog="sqsq", description="sqsq: an SQS-compatible message queue", parents=[_common(False)]
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    export_cli.add_parser(sub)
    backup_cli.add_parser(sub)
    cluster_cli.add_parser(sub)

    p = sub.add_parser("server", help="run a single-node server")
    p.add_argument("--data-dir", default="./data", help="where the queues are stored")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--grpc-port", type=_port, default=7400, help="gRPC port (default 7400)")
    p.add_argument("--http-port", type=_port, default=9324, help="SQS HTTP port (default 9324)")
    p.add_argument("--credentials", default=None,
                   help="access keys file (or env SQSQ_CREDENTIALS_FILE); none: runs open")
    p.add_argument("--region", default=None,
                   help="default region: of callers who name none (a SigV4 signature names "
                        "one) (env SQSQ_REGION, us-east-1)")
    p.add_argument("--account", default=None,
                   help="account id in URLs and ARNs (env SQSQ_ACCOUNT, 000000000000)")
    p.add_argument("--public-url", default=None,
                   help="base of queue URLs (env SQSQ_PUBLIC_URL; default http://HOST:HTTP_PORT)")
    p.add_argument("--no-fsync", action="store_true",
                   help="acknowledge before data reaches the disk (benchmarks only)")
    _ops_flags(p)
    p.set_defaults(handler=cmd_server, needs_client=False)

    p = sub.add_parser("node",
                       help="run one replica of a shard's three-member Raft group")
    p.add_argument("--data-dir", required=True, help="this node's directory")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--grpc-port", type=int, required=True, help="shard service gRPC port")
    p.add_argument("--raft-port", type=int, required=True,
                   help="Raft port: one for every shard (a shard's member is named by "
                        "this + the shard's id)")
    p.add_argument("--etcd", default=None,
                   help="etcd host:port (an etcd cluster: every member, comma-separated): join "
                        "the cluster it coordinates (with --node-id)")
    p.add_argument("--node-id", default=None, help="this node's id in the cluster (with --etcd)")
    p.add_argument("--shards", type=int, default=1,
                   help="how many shards the cluster has (with --etcd; the controller creates "
                        "them once three nodes are live)")
    p.add_argument("--initial-nodes", type=int, default=3,
                   help="the controller places the first shards once this many nodes are live "
                        "(with --etcd; default 3)")
    p.add_argument("--replace-after", type=float, default=10.0, metavar="SECONDS",
                   help="the controller moves a dead node's replicas to other nodes after "
                        "it has been gone this long (with --etcd; default 10)")
    p.add_argument("--host-label", default="",
                   help="the machine this node runs on (with --etcd): no two replicas of a "
                        "shard are placed on one (default: the address it advertises)")
    p.add_argument("--advertise", default=None,
                   help="the host other nodes and gateways reach this node by (default --host)")
    p.add_argument("--peers", default=None,
                   help="instead of --etcd, one static group: every member, this one too: "
                        "host:grpc_port:raft_port,...")
    p.add_argument("--bootstrap", action="store_true",
                   help="a new data directory forms a new group (only on the group's first "
                        "start; without it a new directory rejoins as a learner)")
    p.add_argument("--secret-file", default=None,
                   help="the cluster's receipt-handle secret, the same file on every node "
                        "(env SQSQ_CLUSTER_SECRET_FILE)")
    p.add_argument("--credentials", default=None,
                   help="access keys file (or env SQSQ_CREDENTIALS_FILE); none: runs open")
    p.add_argument("--region", default=None,
                   help="default region: of callers who name none (a SigV4 signature names "
                        "one) (env SQSQ_REGION, us-east-1)")
    p.add_argument("--account", default=None,
                   help="account id in URLs and ARNs (env SQSQ_ACCOUNT, 000000000000)")
    p.add_argument("--compaction-entries", type=int, default=5000,
                   help="compact the Raft log (snapshot) after this many entries")
    p.add_argument("--no-fsync", action="store_true",
                   help="acknowledge before data reaches the disk (benchmarks only)")
    _ops_flags(p)
    p.set_defaults(handler=cmd_node, needs_client=False)

    p = sub.add_parser("gateway",
                       help="run the public HTTP and gRPC API in front of a cluster or a node")
    p.add_argument("--etcd", default=None,
                   help="etcd host:port of the cluster to route over (its partition map; an etcd "
                        "cluster: every member, comma-separated)")
    p.add_argument("--partitions", type=int, default=1,
                   help="partitions of a new queue, each on its own shard (with --etcd)")
    p.add_argument("--backend", default=None,
                   help="instead of --etcd, one node's gRPC address host:port "
                        "(e.g. a `sqsq server`)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--grpc-port", type=_port, default=7400, help="gRPC port (default 7400)")
    p.add_argument("--http-port", type=_port, default=9324, help="SQS HTTP port (default 9324)")
    p.add_argument("--credentials", default=None,
                   help="access keys file (or env SQSQ_CREDENTIALS_FILE); none: runs open")
    p.add_argument("--account", default=None,
                   help="account id in queue URLs; the node's (env SQSQ_ACCOUNT, 000000000000)")
    p.add_argument("--region", default=None,
                   help="region of callers who name none; the node's (env SQSQ_REGION, "
                        "us-east-1)")
    p.add_argument("--public-url", default=None,
                   help="base of queue URLs (env SQSQ_PUBLIC_URL; default http://HOST:HTTP_PORT)")
    _ops_flags(p)
    p.set_defaults(handler=cmd_gateway, needs_client=False)

    q = sub.add_parser("queue", help="create, list, inspect, delete, purge queues")
    qsub = q.add_subparsers(dest="queue_command", metavar="ACTION", required=True)
    p = qsub.add_parser("create", help="create a queue, print its URL", parents=[common])
    p.add_argument("name")
    p.add_argument("--attr", action="append", metavar="K=V", help="queue attribute (repeat)")
    p.add_argument("--fifo", action="store_true", help="FIFO queue (adds .fifo to the name)")
    p.set_defaults(handler=queue_cli.cmd_queue_create)
    p = qsub.add_parser("list", help="list queue URLs", parents=[common])
    p.add_argument("--prefix", default="", help="only names starting with this")
    p.set_defaults(handler=queue_cli.cmd_queue_list)
    p = qsub.add_parser("attrs", help="show (and with --set change) attributes", parents=[common])
    p.add_argument("name", help="queue name or URL")
    p.add_argument("--set", action="append", metavar="K=V", help="attribute to set (repeat)")
    p.set_defaults(handler=queue_cli.cmd_queue_attrs)
    for action, handler, text in (
        ("delete", queue_cli.cmd_queue_delete, "delete a queue"),
        ("purge", queue_cli.cmd_queue_purge, "delete every message of a queue"),
    ):
        p = qsub.add_parser(action, help=text, parents=[common])
        p.add_argument("name", help="queue name or URL")
        p.set_defaults(handler=handler)

    p = sub.add_parser("send", help="send a message, print its id", parents=[common])
    p.add_argument("queue", help="queue name or URL")
    p.add_argument("body", nargs="?", help="the body; - reads it from stdin")
    p.add_argument("--body-file", metavar="PATH", help="read the body from this file")
    p.add_argument("--group", help="MessageGroupId (FIFO)")
    p.add_argument("--dedup-id", help="MessageDeduplicationId (FIFO)")
    p.add_argument("--delay", type=int, help="DelaySeconds")
    p.add_argument("--attr", action="append", metavar="NAME=VALUE", help="String attribute")
    p.set_defaults(handler=queue_cli.cmd_send)

    p = sub.add_parser("receive", help="receive and print messages", parents=[common])
    p.add_argument("queue", help="queue name or URL")
    p.add_argument("-n", type=int, default=1, help="max messages (1-10, default 1)")
    p.add_argument("--wait", type=int, help="long-poll seconds (0-20)")
    p.add_argument("--visibility-timeout", type=int, help="seconds to hide received messages")
    p.add_argument("--delete", action="store_true", help="delete after printing")
    p.set_defaults(handler=queue_cli.cmd_receive)

    p = sub.add_parser("delete", help="delete a message by receipt handle", parents=[common])
    p.add_argument("queue", help="queue name or URL")
    p.add_argument("receipt_handle")
    p.set_defaults(handler=queue_cli.cmd_delete)
    return parser


def _error(args: argparse.Namespace, e: QueueError, hint: str | None = None) -> None:
    if getattr(args, "json", False):
        error = {"Code": e.code, "Message": e.message, **({"Hint": hint} if hint else {})}
        print(json.dumps({"Error": error}, sort_keys=True), file=sys.stderr)
        return
    print(f"error: {e}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``sqsq`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "needs_client", True):
        return args.handler(args)
    try:
        with Client(args.endpoint) as client:
            return args.handler(args, client)
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    except ServiceUnavailable as e:
        hint = (f"is the server running at {args.endpoint}? Start one with `sqsq server` or "
                "pass --endpoint / SQSQ_ENDPOINT.")
        _error(args, e, hint)
        return 1
    except QueueError as e:
        _error(args, e)
        return 1
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
