"""The few file operations every durable write in the storage adapters is built from.

A write is durable when its data and the directory entry naming it are both on the disk:
``fsync`` of the file, then of its directory. Replacing a file is durable and atomic when the
new content goes to a temporary file that is fsynced, renamed over the old one, and the
directory fsynced: a crash leaves either the old file or the new one, whole, never neither
(the pysyncobj ``.meta`` file was rewritten in place, finding 6).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

TMP_SUFFIX = ".tmp"  # a leftover of a write a crash cut short; readers ignore it


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (files created, renamed, unlinked) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """``os.write`` may write less than it was given (a signal, a full disk); loop."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    """``os.pwrite`` until all of ``data`` is at ``offset`` on."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename over, directory fsync."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)  # the content is on disk before any name points at it
    finally:
        os.close(fd)
    os.replace(tmp, path)  # atomic: a reader sees the old file or the new one
    fsync_dir(path.parent)  # the rename itself survives a power loss


def make_dir(path: Path) -> None:
    """``mkdir -p``, durably: a directory created here is fsynced into its parent, or a
    power loss could take it, and everything written in it, away."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        p.mkdir(exist_ok=True)
        fsync_dir(p.parent)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (a staged state directory), deepest
    first, so that renaming ``root`` into place publishes only durable content."""
    for dirpath, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_file(Path(dirpath) / name)
        fsync_dir(Path(dirpath))


def remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
