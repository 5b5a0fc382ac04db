"""The segmented Raft log against real files: what is appended and synced reads back after a
reopen; a torn last record is cut off and the log goes on; damage anywhere else stops the
replica with a message naming the file; truncation only where asked; compaction unlinks whole
segments and never rewrites a kept one, also when a crash cuts it short.

Crashes are exceptions raised at one step (``storagesupport``). Each safeguard also has a
mutant test: the same scenario with the safeguard switched off shows the loss it prevents.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sqsq.raft import Entry
from sqsq.shard import raftlog, raftrecord
from sqsq.shard.raftlog import CorruptLog, SegmentedLog
from sqsq.shard.raftrecord import encode_record
from storagesupport import Crash, crash_after, crash_writing, make, reopen, written


def test_entries_read_back_across_segments_and_after_reopening(tmp_path: Path) -> None:
    log = written(tmp_path)
    paths = log.segment_paths()
    assert len(paths) > 3  # the log rolled over several segments
    assert paths[0].name == "00000000000000000001.log"
    firsts = [int(p.name[:20]) for p in paths]
    assert all(p.stat().st_size < 300 + 64 for p in paths[:-1])  # rolled once past 300 B
    log = reopen(log)
    assert log.entries() == make(40)
    assert (log.first_index(), log.last_index()) == (1, 40)
    assert [log.term(i) for i in (0, 1, 40, 41)] == [0, 1, 1, None]
    assert log.entries(after=firsts[2]) == make(40)[firsts[2]:]
    assert [int(p.name[:20]) for p in log.segment_paths()] == firsts


def test_appends_are_checked_to_follow_the_log(tmp_path: Path) -> None:
    log = written(tmp_path, n=5)
    with pytest.raises(ValueError, match="does not follow"):
        log.append([Entry(7, 1)])
    with pytest.raises(ValueError, match="not consecutive"):
        log.append([Entry(6, 1), Entry(8, 1)])
    log.close()


@pytest.mark.parametrize("keep", [3, 9, 30])  # cut in the header, just after it, in the data
def test_a_torn_last_record_is_cut_off_and_the_log_goes_on(tmp_path: Path, keep: int) -> None:
    log = written(tmp_path)
    end = crash_writing(log, encode_record(41, 1, 0, b"x" * 50)[:keep])
    log = SegmentedLog(tmp_path / "log", 300)
    assert log.last_index() == 40 and log.end() == end
    assert end[0].read_bytes()[end[1]:].count(0) == end[0].stat().st_size - end[1]  # cut
    log.append(make(5, term=2, start=41))
    log.sync()
    log = reopen(log)
    assert log.entries() == make(40) + make(5, term=2, start=41)
    log.close()


def test_a_torn_record_with_an_unwritten_page_is_cut_with_what_follows(tmp_path: Path) -> None:
    """An unsynced write whose pages reached the disk out of order: a page of the first
    record reads back as zeros, the record after it is whole. Nothing of it was synced."""
    log = written(tmp_path, segment_bytes=1 << 20)
    torn = bytearray(encode_record(41, 1, 0, b"y" * 20000))
    start = log.end()[1]  # type: ignore[index]
    page = (start // 4096 + 2) * 4096 - start  # a whole page inside the record, zeroed
    torn[page:page + 4096] = bytes(4096)
    end = crash_writing(log, bytes(torn + encode_record(42, 1, 0, b"z")))
    log = SegmentedLog(tmp_path / "log", 1 << 20)
    assert log.last_index() == 40 and log.end() == end
    log.close()


def test_space_is_allocated_ahead_of_the_data_a_bounded_chunk_at_a_time(
        tmp_path: Path) -> None:
    """So that most syncs find the space allocated (none journals the file's growth), and a
    node with many replicas reserves a few MiB each, not a 64 MiB segment."""
    log = SegmentedLog(tmp_path / "log")
    log.append(make(40))
    log.sync()
    path, data_end = log.end()  # type: ignore[misc]
    assert path.stat().st_size == data_end + raftlog.PREALLOCATE_BYTES
    log.append(make(10, start=41))  # within the allocation: the file does not grow
    assert path.stat().st_size == data_end + raftlog.PREALLOCATE_BYTES
    log = reopen(log)  # the zeros after the data are its end, and stay allocated
    assert log.last_index() == 50
    assert path.stat().st_size == data_end + raftlog.PREALLOCATE_BYTES
    log.close()


def test_zeros_past_the_end_and_a_header_of_zeros_are_a_torn_write(tmp_path: Path) -> None:
    """The file grew but its data never reached the disk (XFS's "NULL files"); or the page
    holding the next header was not written while a later one was."""
    log = written(tmp_path)  # 300-byte segments: the last one has outgrown its allocation
    path, data_end = log.end()  # type: ignore[misc]
    log.close()
    with open(path, "ab") as f:
        f.write(bytes(700))
    log = SegmentedLog(tmp_path / "log", 300)
    assert log.end() == (path, data_end)
    crash_writing(log, bytes(600) + encode_record(42, 1, 0, b"written before 41's page"))
    log = SegmentedLog(tmp_path / "log", 300)
    assert log.last_index() == 40 and log.end() == (path, data_end)
    log.append(make(1, start=41))
    log = reopen(log)
    assert log.entries() == make(41)
    log.close()


def flip_middle_of(log: SegmentedLog, path: Path) -> int:
    """Flip one data byte of an entry in the middle of ``path``; return that entry's index."""
    firsts = [int(p.name[:20]) for p in log.segment_paths()] + [1 << 62]
    k = firsts.index(int(path.name[:20]))
    entries = [e for e in log.entries() if firsts[k] <= e.index < firsts[k + 1]]
    log.close()
    raw = bytearray(path.read_bytes())
    offset = 0
    for e in entries[: len(entries) // 2]:
        offset += len(encode_record(e.index, e.term, int(e.kind), e.data))
    victim = entries[len(entries) // 2]
    record = encode_record(victim.index, victim.term, int(victim.kind), victim.data)
    assert raw[offset:offset + len(record)] == record
    raw[offset + len(record) - 3] ^= 0x40  # inside the entry's data
    path.write_bytes(bytes(raw))
    return victim.index


def test_a_damaged_record_before_the_last_segment_stops_the_replica(tmp_path: Path) -> None:
    log = written(tmp_path)
    path = log.segment_paths()[1]
    index = flip_middle_of(log, path)
    with pytest.raises(CorruptLog) as err:
        SegmentedLog(tmp_path / "log", 300)
    message = str(err.value)
    assert str(path) in message and "bad checksum" in message
    assert f"entry {index}" in message and "offset" in message
    assert "backup" in message and "replace the replica" in message
    assert path.exists() and all(p.exists() for p in log.segment_paths())  # nothing cut


def test_a_damaged_record_inside_the_last_segment_stops_the_replica(tmp_path: Path) -> None:
    """Records follow it, so it is not a torn tail: cutting there would drop synced entries."""
    log = written(tmp_path)
    path = log.segment_paths()[-1]
    size = path.stat().st_size
    flip_middle_of(log, path)
    with pytest.raises(CorruptLog, match="bad checksum"):
        SegmentedLog(tmp_path / "log", 300)
    assert path.stat().st_size == size


def test_mutant_without_checksums_a_damaged_entry_is_served_as_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two tests above fail without the checksum: the damaged entry reads as data."""
    monkeypatch.setattr(raftrecord, "checksum", lambda length, payload: 0)
    log = written(tmp_path)
    index = flip_middle_of(log, log.segment_paths()[1])
    reopened = SegmentedLog(tmp_path / "log", 300)  # no CorruptLog
    assert reopened.entries()[index - 1] != make(40)[index - 1]
    reopened.close()


def test_segments_out_of_sequence_stop_the_replica(tmp_path: Path) -> None:
    log = written(tmp_path)
    middle = log.segment_paths()[2]
    log.close()
    middle.unlink()
    with pytest.raises(CorruptLog, match="a segment starting at"):
        SegmentedLog(tmp_path / "log", 300)


def test_an_empty_last_segment_left_by_a_crash_is_removed(tmp_path: Path) -> None:
    log = written(tmp_path)
    path, data_end = log.end()  # type: ignore[misc]
    log.close()
    os.truncate(path, data_end)  # a roll trims the full segment to its data, syncs it,
    with open(tmp_path / "log" / f"{41:020d}.log", "wb") as f:  # then starts the next
        os.posix_fallocate(f.fileno(), 0, 300)  # the crash came before anything was in it
    log = SegmentedLog(tmp_path / "log", 300)
    assert log.last_index() == 40 and not (tmp_path / "log" / f"{41:020d}.log").exists()
    log.append(make(1, start=41))
    log.close()


def test_truncation_at_a_conflict_drops_what_follows_and_later_segments(
        tmp_path: Path) -> None:
    log = written(tmp_path)
    paths = log.segment_paths()
    log.append([Entry(12, 2, b"new")])  # the core found a conflict at 12
    assert log.last_index() == 12 and log.term(12) == 2 and log.term(13) is None
    kept = [p for p in paths if int(p.name[:20]) <= 12]
    assert log.segment_paths() == kept
    assert not any(p.exists() for p in paths if p not in kept)
    log.append(make(3, term=2, start=13))
    log.sync()
    log = reopen(log)
    assert log.entries() == make(11) + [Entry(12, 2, b"new")] + make(3, term=2, start=13)
    log.close()


def test_truncation_cut_short_by_a_crash_leaves_a_contiguous_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = written(tmp_path)
    monkeypatch.setattr(Path, "unlink", crash_after(1, Path.unlink))
    with pytest.raises(Crash):
        log.append([Entry(5, 2, b"new")])
    monkeypatch.undo()
    log = reopen(log)  # the newest segment went first: a shorter log, no gap
    assert log.entries() == make(log.last_index())
    assert log.last_index() < 40
    log.close()


def stats(paths: list[Path]) -> list[tuple[int, int, int]]:
    return [(p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in paths]


def test_compaction_drops_whole_segments_and_never_rewrites_a_kept_one(
        tmp_path: Path) -> None:
    log = written(tmp_path)
    paths = log.segment_paths()
    cut = int(paths[3].name[:20]) + 1  # inside the fourth segment
    kept = paths[3:]
    before = stats(kept)
    log.compact(cut)
    assert log.segment_paths() == kept
    assert not any(p.exists() for p in paths[:3])
    assert stats(kept) == before  # the same files, untouched
    assert log.first_index() == int(paths[3].name[:20])  # it still holds a few covered ones
    assert log.entries(after=cut) == make(40)[cut:]
    log.compact(10_000)
    assert log.segment_paths() == paths[-1:]  # the active segment stays
    log = reopen(log)
    assert log.entries(after=cut) == make(40)[int(paths[-1].name[:20]) - 1:]
    log.close()


def test_compaction_cut_short_by_a_crash_keeps_every_kept_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = written(tmp_path)
    monkeypatch.setattr(Path, "unlink", crash_after(1, Path.unlink))
    with pytest.raises(Crash):
        log.compact(30)
    monkeypatch.undo()
    log = reopen(log)
    assert log.first_index() > 1  # the oldest segment went
    assert log.entries(after=30) == make(40)[30:]
    assert log.entries() == make(40)[log.first_index() - 1:]
    log.close()


def test_mutant_a_compaction_that_rewrites_the_log_loses_entries_in_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pysyncobj's way (finding 1): clear the log, re-add the kept entries one by one. The
    same check as above (every kept entry survives) fails when a crash cuts it short."""

    def rewriting_compact(self: SegmentedLog, index: int) -> None:
        kept = self.entries(after=index)
        self.reset(index, self.term(index) or 0)
        for e in kept:
            self.append([e])
            self.sync()

    monkeypatch.setattr(SegmentedLog, "compact", rewriting_compact)
    log = written(tmp_path)
    monkeypatch.setattr(raftlog, "pwrite_all", crash_after(3, raftlog.pwrite_all))
    with pytest.raises(Crash):
        log.compact(30)
    monkeypatch.undo()
    log = reopen(log)
    assert log.entries(after=30) != make(40)[30:]  # 31..40 were acknowledged; few are left
    log.close()


def test_reset_leaves_an_empty_log_that_remembers_where_it_continues(tmp_path: Path) -> None:
    log = written(tmp_path)
    log.reset(100, 7)  # a snapshot at 100 (term 7) from the leader replaced the log
    assert [p.name for p in log.segment_paths()] == [f"{100:020d}.log"]
    log = reopen(log)
    assert (log.first_index(), log.last_index(), log.term(100)) == (101, 100, 7)
    assert log.entries() == []
    with pytest.raises(ValueError):
        log.append([Entry(100, 7)])  # the snapshot's own index is not an entry to rewrite
    log.append(make(3, term=7, start=101))
    log.sync()
    log = reopen(log)
    assert log.entries() == make(3, term=7, start=101)
    log.compact(102)  # the marker's segment is the active one: kept
    assert log.term(100) == 7
    log.close()


def test_a_segment_written_whole_is_synced_before_the_next_holds_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """So a crash can tear only the last segment: a torn record in an earlier one would read
    as damage and stop the replica."""
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    log = SegmentedLog(tmp_path / "log", 300)
    log.append(make(40))  # several rolls, no sync asked for
    assert len(synced) == len(log.segment_paths()) - 1
    log.close()
