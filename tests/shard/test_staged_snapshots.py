"""A follower that installs a snapshot keeps no other received snapshot file behind: copies
superseded by the one installed (an older snapshot the leader sent before, or sent again)
are deleted with it, so the node's incoming directory does not grow with every catch-up."""

from __future__ import annotations

from pathlib import Path

from shardgroup import Group, run, until
from sqsq.api import Endpoint
from sqsq.core import commands as c
from sqsq.shard.host import ReplicaOptions
from sqsq.shard.service import ShardService


def test_an_install_deletes_the_snapshot_files_it_supersedes(tmp_path: Path) -> None:
    async def scenario(group: Group) -> None:
        lead = await group.settled_leader()
        api = ShardService(lead, Endpoint())
        await api.create_queue("orders")
        lagging = next(e for e in group.engines if e is not lead)
        i = group.engines.index(lagging)
        incoming = group.root / f"n{i}" / "incoming-snapshots"
        incoming.mkdir(parents=True, exist_ok=True)
        # Two snapshots received earlier and never installed, older than any to come.
        for n in (1, 2):
            stale = incoming / f"earlier-{n}.snap"
            stale.write_bytes(b"an older snapshot")
            lagging.replica._staged[(n, 1)] = stale
        group.cut.add(lagging.replica.id)
        for n in range(60):  # past the leader's compaction: the follower needs a snapshot
            await api.send_message_batch("orders", [c.SendEntry("0", f"m{n}")])
        assert lead.replica.snapshots_written >= 1
        group.cut.clear()
        await until(lambda: lagging.replica.storage.latest_snapshot() is not None
                    and lagging.applied_index >= lead.applied_index)
        assert sorted(p.name for p in incoming.iterdir()) == []

    run(scenario, tmp_path, ReplicaOptions(bootstrap=True, memory=True,
                                           compaction_min_entries=20))
