"""The Raft journal's file: what ``add`` writes (with pwrite, see ``journal._JournalFile``) is
what a replica reads back, in the same run and after a restart, also past the file's growth."""

from __future__ import annotations

import os
from pathlib import Path

from sqsq.shard.journal import DurableJournal


def test_entries_read_back_now_and_after_reopening_past_the_files_growth(
        tmp_path: Path) -> None:
    path = str(tmp_path / "raft.journal")
    journal = DurableJournal(path)
    initial_size = os.path.getsize(path)
    entries = [(os.urandom(10 + 37 * i % 300), i + 1, 1 + i // 50) for i in range(400)]
    for command, idx, term in entries:
        journal.add(command, idx, term)
    journal.sync()
    assert os.path.getsize(path) > initial_size  # the writes went past the first size
    assert [journal[i] for i in range(len(journal))] == entries
    journal._destroy()

    reopened = DurableJournal(path)
    assert [reopened[i] for i in range(len(reopened))] == entries
    reopened.deleteEntriesFrom(300)  # a follower's conflicting tail
    reopened.add(b"replacement", 301, 9)
    reopened.sync()
    reopened._destroy()

    again = DurableJournal(path)
    assert [again[i] for i in range(len(again))] == [*entries[:300], (b"replacement", 301, 9)]
    again._destroy()


def test_the_journals_own_flush_still_works(tmp_path: Path) -> None:
    journal = DurableJournal(str(tmp_path / "raft.journal"))
    journal.add(b"one", 1, 1)
    journal.flush()  # FileJournal's msync, through the pwrite file
    journal._destroy()
    reopened = DurableJournal(str(tmp_path / "raft.journal"))
    assert reopened[0] == (b"one", 1, 1)
    reopened._destroy()
