"""``python -m bench.r3stages`` still runs: three nodes elect a leader under its timing
patches and the lone sends are traced on every node. (Its patched node clock once took a
signature the clock no longer had: no node ticked, no leader was elected, and the tool
failed with "no leader found" until someone ran it again.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_r3stages_traces_lone_sends_through_a_leader_and_its_followers() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "bench.r3stages", "--sends", "30"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    traced = re.search(r"^(\d+) lone sends", out.stdout, re.MULTILINE)
    assert traced is not None, out.stdout[-2000:]
    assert int(traced.group(1)) > 0
    for stage in ("L propose", "F1 fsync.end", "F1 sent ack", "L commit moved", "L answered"):
        assert stage in out.stdout, stage


def test_a_late_answer_about_the_call_before_is_not_this_calls() -> None:
    from bench.r3stages import node_stamps

    # The leader: the last call's second answer lands early in this one, before this call's
    # entry is proposed; this entry's answer and commit come after its own write.
    leader = [("got ack", 1.001, 6), ("read", 1.002), ("propose", 1.003, 7),
              ("fsync", 1.004), ("got ack", 1.005, 7), ("fsync.end", 1.006),
              ("advance(entries)", 1.007), ("commit moved", 1.0071), ("pause gc0", 1.008, 0.001)]
    first, pauses, j = node_stamps(leader, 0, 1.0, 1.01)
    assert first["got ack"] == 1.005 and "got ack (2nd)" not in first
    assert first["commit moved"] == 1.0071
    assert pauses == [("gc0", 0.001)] and j == len(leader)
    # A follower still answering the last entry as this call begins.
    follower = [("sent ack", 0.999), ("fsync.end", 1.0005), ("sent ack", 1.0006),
                ("got append", 1.004), ("fsync", 1.0045), ("fsync.end", 1.005),
                ("sent ack", 1.0055)]
    first, _, _ = node_stamps(follower, 0, 1.0, 1.01)
    assert first["sent ack"] == 1.0055 and first["fsync.end"] == 1.005
