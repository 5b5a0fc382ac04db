"""The core is pure: no I/O, no clock, no randomness, no transport. Walk its imports."""

from __future__ import annotations

import ast
from pathlib import Path

import sqsq.core

FORBIDDEN = {
    "grpc", "rocksdict", "pysyncobj", "etcd3", "aetcd", "time", "random", "uuid", "secrets",
    "threading", "asyncio", "socket", "os", "subprocess", "datetime", "sqsq.shard",
    "sqsq.gateway", "sqsq.client", "sqsq.control", "sqsq.cli",
}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_core_modules_import_nothing_impure() -> None:
    core_dir = Path(sqsq.core.__file__).parent
    offenders = {}
    for path in sorted(core_dir.glob("*.py")):
        bad = {
            m for m in imported_modules(path)
            if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)
        }
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_the_check_catches_an_impure_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom grpc import aio\n")
    assert imported_modules(bad) >= {"time", "grpc"}
