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
