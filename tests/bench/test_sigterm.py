"""A benchmark stopped with SIGTERM (``timeout``, a CI job cancelled) stops the servers it
started, as Ctrl-C does: its cleanup runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, signal, sys, time
from contextlib import ExitStack
from bench.procs import stop_on_sigterm
if sys.argv[2] == "on":
    stop_on_sigterm()
with ExitStack() as stack:
    stack.callback(lambda: open(sys.argv[1], "w").write("stopped"))
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
"""


def _run(tmp_path: Path, mode: str) -> tuple[int, Path]:
    marker = tmp_path / f"cleanup-{mode}"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(marker), mode], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    return proc.returncode, marker


def test_sigterm_runs_the_cleanup_that_stops_the_servers(tmp_path: Path) -> None:
    code, marker = _run(tmp_path, "on")
    assert marker.read_text() == "stopped"
    assert code == 128 + signal.SIGTERM


def test_without_it_sigterm_ends_python_before_any_cleanup(tmp_path: Path) -> None:
    code, marker = _run(tmp_path, "off")
    assert not marker.exists()
    assert code == -signal.SIGTERM
