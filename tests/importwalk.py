"""The modules a source file imports, read from its syntax tree (for the import rules' tests)."""

from __future__ import annotations

import ast
from pathlib import Path


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
