"""Helpers for the storage tests: a log of known entries, and crashes. A crash is an
exception raised at one step of an operation, after which the test reopens the files as they
are: every step before it has completed (and synced, where the code syncs). Losing unsynced
page-cache writes cannot be shown with real files, so torn records are written by hand."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sqsq.raft import Entry, EntryKind
from sqsq.shard import raftlog
from sqsq.shard.raftlog import SegmentedLog


class Crash(Exception):
    """The process died here."""


def crash(*args: object, **kwargs: object) -> None:
    raise Crash


def crash_after(calls: int, real: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, which raises Crash from its ``calls + 1``-th call on."""
    count = 0

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal count
        count += 1
        if count > calls:
            raise Crash
        return real(*args, **kwargs)

    return wrapper


# Every call that changes what is on the disk, for crash_at_step.
DISK_STEPS: list[tuple[object, str]] = [
    (os, "fsync"), (os, "fdatasync"), (os, "replace"), (os, "rename"), (os, "ftruncate"),
    (Path, "unlink"), (raftlog, "pwrite_all")]


def crash_at_step(monkeypatch: pytest.MonkeyPatch, step: int,
                  targets: list[tuple[object, str]] = DISK_STEPS) -> list[str]:
    """Each call of a target (a write, sync, rename, unlink) is a step; the ``step``-th
    raises Crash. Returns the steps taken, named."""
    taken: list[str] = []
    for owner, name in targets:
        real = getattr(owner, name)

        def wrapper(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            if len(taken) == step:
                raise Crash
            taken.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)
    return taken


def make(n: int, term: int = 1, start: int = 1) -> list[Entry]:
    return [Entry(i, term, bytes([i % 251]) * (20 + i % 7),
                  EntryKind.CONF if i % 10 == 0 else EntryKind.NORMAL)
            for i in range(start, start + n)]


def reopen(log: SegmentedLog) -> SegmentedLog:
    log.close()
    return SegmentedLog(log.directory, log.segment_bytes)


def written(tmp_path: Path, n: int = 40, segment_bytes: int = 300) -> SegmentedLog:
    log = SegmentedLog(tmp_path / "log", segment_bytes)
    log.append(make(n))
    log.sync()
    return log


def crash_writing(log: SegmentedLog, data: bytes) -> tuple[Path, int]:
    """The process dies with ``data`` written after the log's data (into the preallocated
    space) and not synced; returns the last segment and where its data ended."""
    end = log.end()
    assert end is not None
    log.close()
    fd = os.open(end[0], os.O_WRONLY)
    os.pwrite(fd, data, end[1])
    os.close(fd)
    return end
