"""A partition map that never changes, for tests of what reads one (no etcd)."""

from __future__ import annotations

from dataclasses import dataclass

from sqsq.control.partition_map import MapSnapshot


@dataclass
class FixedMap:
    """Stands in for ``PartitionMap``: its readers only look at ``snapshot``."""

    snapshot: MapSnapshot
