"""``sqsq export``: write a point-in-time snapshot of every shard as Parquet datasets.

    sqsq export --out ./snapshots --endpoint 127.0.0.1:7400     # a running server
    sqsq export --out ./snapshots --endpoint GATEWAY            # a cluster (every shard)
    sqsq export --out ./snapshots --data-dir ./data             # a stopped server's data

Exports into the same ``--out`` accumulate (one ``snapshot_ms=`` directory each), which is
what the backlog report's growth rates are computed from.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "export", help="snapshot the queues to Parquet for analytics",
        description="Take a consistent point-in-time snapshot of each shard (never stopping "
        "writes) and write queues / messages / delivery Parquet datasets plus manifest.json.",
    )
    p.add_argument("--out", required=True, type=Path, help="output directory (accumulates)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--data-dir", type=Path, help="data directory of a stopped server")
    # its own dest: the main parser's global --endpoint has a default, this one must be given
    source.add_argument("--endpoint", dest="export_endpoint", metavar="HOST:PORT",
                        help="gRPC address of a running server, or of a cluster's "
                        "gateway, on this machine")
    p.add_argument("--include-bodies", action="store_true", help="also export message bodies")
    p.set_defaults(handler=run, needs_client=False)
    return p


def run(args: argparse.Namespace) -> int:
    from sqsq.analytics.export import ExportError, export_data_dir, export_endpoint

    try:
        if args.data_dir is not None:
            entry = export_data_dir(args.data_dir, args.out, include_bodies=args.include_bodies)
        else:
            entry = export_endpoint(args.export_endpoint, args.out,
                                    include_bodies=args.include_bodies)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for s in entry["shards"]:
        print(f"shard {s['shard']}: {s['queues']} queues, {s['messages']} messages "
              f"as of {s['as_of_ms']}")
    print(f"snapshot_ms={entry['snapshot_ms']} written to {args.out} (manifest.json updated)")
    return 0
