"""The core is pure: no I/O, no clock, no randomness, no transport. Walk its imports."""

from __future__ import annotations

from pathlib import Path

import pytest

import sqsq.core
import sqsq.raft
from importwalk import imported_modules

FORBIDDEN = {
    "grpc", "rocksdict", "pysyncobj", "etcd3", "aetcd", "time", "random", "uuid", "secrets",
    "threading", "asyncio", "socket", "os", "subprocess", "datetime", "sqsq.shard",
    "sqsq.gateway", "sqsq.client", "sqsq.control", "sqsq.cli",
}


@pytest.mark.parametrize("package", [sqsq.core, sqsq.raft], ids=["core", "raft"])
def test_core_modules_import_nothing_impure(package: object) -> None:
    """Both pure cores: the delivery state machine and consensus. The consensus core's one
    source of randomness is the generator its host passes (imported for its type only)."""
    core_dir = Path(package.__file__).parent  # type: ignore[attr-defined]
    forbidden = FORBIDDEN | ({"sqsq.core", "sqsq.sim"} if package is sqsq.raft else set())
    offenders = {}
    for path in sorted(core_dir.glob("*.py")):
        bad = {
            m for m in imported_modules(path, runtime_only=True)
            if any(m == f or m.startswith(f + ".") for f in forbidden)
        }
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_the_check_catches_an_impure_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom grpc import aio\n")
    assert imported_modules(bad) >= {"time", "grpc"}
