"""The segmented log under faults: a crash at every step of a truncation and a compaction,
random operations against a model with torn writes between them, a failed sync, a full
disk. Each safeguard here is shown by a test that fails without it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sqsq.raft import Entry
from sqsq.shard import raftlog
from sqsq.shard.raftlog import SegmentedLog
from sqsq.shard.raftrecord import encode_record
from storagesupport import Crash, crash_at_step, crash_writing, make, reopen, written


@pytest.mark.parametrize("step", range(13))  # 12 steps, then none
def test_a_crash_at_any_step_of_a_truncation_leaves_a_log_that_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Either a prefix of the old log (what was cut was not committed) or the new one."""
    log = written(tmp_path)
    taken = crash_at_step(monkeypatch, step)
    try:
        log.append([Entry(5, 2, b"new"), Entry(6, 2, b"new")])
        log.sync()
    except Crash:
        pass
    monkeypatch.undo()
    assert step < 12 or len(taken) == 12  # the last case ran the truncation whole
    got = reopen(log).entries()
    assert got in ([*make(4), Entry(5, 2, b"new"), Entry(6, 2, b"new")],
                   make(40)[:len(got)])


@pytest.mark.parametrize("step", range(7))  # 6 steps, then none
def test_a_crash_at_any_step_of_a_compaction_keeps_every_kept_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    log = written(tmp_path)
    taken = crash_at_step(monkeypatch, step)
    try:
        log.compact(30)
    except Crash:
        pass
    monkeypatch.undo()
    assert step < 6 or len(taken) == 6
    log = reopen(log)
    assert log.entries(after=30) == make(40)[30:]
    assert log.entries() == make(40)[log.first_index() - 1:]
    log.close()


_op = st.tuples(st.sampled_from(["append", "append", "append", "sync", "compact", "reopen",
                                 "torn"]),
                st.integers(0, 1 << 16), st.integers(1, 9), st.booleans())


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, max_size=25))
def test_the_log_matches_a_list_through_random_appends_truncations_compactions_and_crashes(
        tmp_path: Path, ops: list[tuple[str, int, int, bool]]) -> None:
    """Model: a dict index -> entry, and the highest index compacted (whose entries the log
    may still hold). A torn write is an unsynced append the crash cut: never in the model."""
    directory = tmp_path / os.urandom(6).hex()
    log = SegmentedLog(directory, 200)
    model: dict[int, Entry] = {}
    floor = 0  # compacted up to here
    term = 1
    for op, a, n, flag in ops:
        last = max(model, default=floor)
        if op == "append":
            lo = max(floor + 1, log.first_index())
            start = lo + a % (last + 2 - lo)
            term += flag
            new = [Entry(i, term, os.urandom(a % 60)) for i in range(start, start + n)]
            log.append(new)
            model = {i: e for i, e in model.items() if i < start} | {e.index: e for e in new}
        elif op == "sync":
            log.sync()
        elif op == "compact":
            floor = max(floor, a % (last + 1))
            log.compact(floor)
        elif op == "reopen":
            log = reopen(log)
        else:
            if log.end() is not None:
                record = encode_record(last + 1, term, 0, b"torn" * n)
                crash_writing(log, record[: 1 + a % (len(record) - 1)])  # never all of it
                log = SegmentedLog(directory, 200)
        assert log.last_index() == max(model, default=log.last_index())
        assert log.entries(after=floor) == [model[i] for i in sorted(model) if i > floor]
        assert all(log.term(i) == model[i].term for i in model if i >= log.first_index())
    log.close()


def test_a_failed_sync_is_final(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel may drop pages it failed to write and mark them clean: a retried sync
    could succeed with the data gone. So the log refuses every sync after a failure."""
    log = written(tmp_path, n=3)
    log.append(make(2, start=4))

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(OSError, match="Input/output"):
        log.sync()
    monkeypatch.undo()
    with pytest.raises(OSError, match="an earlier sync failed"):
        log.sync()  # the disk works again, but what the failed sync held may be gone
    with pytest.raises(OSError, match="an earlier sync failed"):
        log.append(make(1, start=6))
    log.close()


def test_a_write_cut_short_by_a_full_disk_is_taken_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Otherwise the next append would follow a torn record, which the next open reads as
    damage in the middle of the log."""
    log = written(tmp_path, n=3, segment_bytes=1 << 20)

    def half_then_enospc(fd: int, data: bytes, offset: int) -> None:
        os.pwrite(fd, bytes(data[: len(data) // 2]), offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(raftlog, "pwrite_all", half_then_enospc)
    with pytest.raises(OSError, match="No space"):
        log.append(make(2, start=4))
    monkeypatch.undo()
    assert log.last_index() == 3
    log.append(make(2, term=2, start=4))  # space was freed; the host goes on
    log.sync()
    log = reopen(log)
    assert log.entries() == make(3) + make(2, term=2, start=4)
    log.close()
