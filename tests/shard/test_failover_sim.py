"""Failover under a seeded fault schedule, with driven ticks and a fake clock: three replicas,
proposals at whichever replica claims to lead, leaders cut off, stopped (SIGSTOP) and
resumed. Whatever the schedule, every acknowledged proposal ends up applied once, in one
order, on every replica; no replica applies anything the others do not; and the group
recovers a leader after every fault."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from raftsupport import raft_group
from sqsq.shard.raft import Proposal


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_acknowledged_proposals_survive_any_fault_schedule(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    # Compaction every few entries: lagging replicas catch up through snapshots too.
    with raft_group(tmp_path, monkeypatch, compaction_min_entries=6) as group:
        group.elect()
        boxes: dict[bytes, list] = {}
        for round_ in range(12):
            fault = rng.choice(["none", "cut-leader", "stop-leader", "cut-follower"])
            leaders = group.leaders()
            target = leaders[0] if leaders else rng.choice(group.addresses)
            if fault == "cut-leader":
                group.cut.add(target)
            elif fault == "stop-leader":
                group.stopped.add(target)
            elif fault == "cut-follower":
                group.cut.add(rng.choice([a for a in group.addresses if a != target]))
            for i in range(rng.randint(1, 4)):
                # Proposals go to every replica that thinks it leads, the stale one included.
                for address, replica in group.replicas.items():
                    if replica.is_leader():
                        data = b"r%d-%d-%s" % (round_, i, address.encode()[-5:])
                        boxes[data] = group.propose(address, data)
                group.step(rng.choice([0.01, 0.05, 0.2]))
            group.run(rng.choice([0.5, 1.5, 3.0]))
            group.cut.clear()
            group.stopped.clear()
            group.elect()
        for attempt in range(10):  # a client retries an unknown outcome at the new leader
            status = group.commit(group.elect(), b"final-%d" % attempt)
            if status is Proposal.COMMITTED:
                break
        assert status is Proposal.COMMITTED
        group.run(2.0)

        logs = [m.payloads() for m in group.machines.values()]
        assert logs[0] == logs[1] == logs[2], "replicas applied different sequences"
        applied = logs[0]
        assert len(applied) == len(set(applied)), "an entry was applied twice"
        acknowledged = [d for d, box in boxes.items() if box and box[0][0] is Proposal.COMMITTED]
        missing = [d for d in acknowledged if d not in applied]
        assert not missing, f"acknowledged but lost: {missing}"
        assert all(d in boxes or d.startswith(b"final-") for d in applied)
