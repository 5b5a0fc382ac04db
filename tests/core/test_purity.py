"""The core is pure: no I/O, no clock, no randomness, no transport. Walk its imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sqsq.core
import sqsq.raft

FORBIDDEN = {
    "grpc", "rocksdict", "pysyncobj", "etcd3", "aetcd", "time", "random", "uuid", "secrets",
    "threading", "asyncio", "socket", "os", "subprocess", "datetime", "sqsq.shard",
    "sqsq.gateway", "sqsq.client", "sqsq.control", "sqsq.cli",
}


def imported_modules(path: Path, runtime_only: bool = False) -> set[str]:
    """The modules ``path`` imports (with ``runtime_only``, not those imported only for type
    checking, under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                skipped.update(id(n) for child in node.body for n in ast.walk(child))
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


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
