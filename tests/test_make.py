"""`make run` installs only what the server needs; `make test` and `make report` the rest."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from serverproc import REPO


def _planned(target: str) -> str:
    """What ``make`` would run for ``target`` from scratch (-B: as if nothing were built)."""
    if shutil.which("make") is None:
        pytest.fail("make is required")
    return subprocess.run(["make", "-n", "-B", target], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True).stdout


def test_make_run_installs_only_the_server() -> None:
    plan = _planned("run")
    assert "pip install -q -e ." in plan and "sqsq server" in plan
    assert "[dev" not in plan and "analytics" not in plan and "apt-get" not in plan


@pytest.mark.parametrize("target", ["test", "report"])
def test_make_test_and_report_install_the_rest(target: str) -> None:
    plan = _planned(target)
    assert "-e '.[dev,analytics]'" in plan and "openjdk" in plan
