"""The host's ReadIndex bookkeeping (``shard.reads``): a read is answered only once the core
confirmed it and the replica applied up to its index; reads the core dropped with its
leadership, or left behind at a stop, are answered as not leading, never left waiting."""

from __future__ import annotations

from sqsq.raft import ReadState
from sqsq.shard.reads import ReadIndexReads


def _asked(reads: ReadIndexReads, n: int, answers: list[tuple[int, bool]]) -> bytes:
    """Ask ``n`` reads in one turn of the loop; send them in term 3. Their context."""
    for i in range(n):
        first = reads.ask(lambda ok, i=i: answers.append((i, ok)))
        assert first == (i == 0)  # only the turn's first schedules the heartbeat round
    context, asked = reads.take()
    assert len(asked) == n
    reads.sent(context, 3, asked)
    return context


def test_a_read_waits_for_the_apply_to_reach_its_index() -> None:
    reads, answers = ReadIndexReads(), []
    context = _asked(reads, 2, answers)
    reads.serve([], applied=5, leading_term=3)
    assert answers == []  # not confirmed yet
    reads.serve([ReadState(7, context)], applied=5, leading_term=3)
    assert answers == []  # confirmed, but index 7 is not applied here yet
    reads.serve([], applied=7, leading_term=3)
    assert answers == [(0, True), (1, True)]


def test_reads_the_core_dropped_with_its_leadership_are_refused() -> None:
    reads, answers = ReadIndexReads(), []
    _asked(reads, 1, answers)
    reads.serve([], applied=9, leading_term=3)
    assert answers == []
    reads.serve([], applied=9, leading_term=None)  # stepped down: the core forgot it
    assert answers == [(0, False)]
    assert not reads.out


def test_a_new_term_refuses_what_the_old_one_asked() -> None:
    reads, answers = ReadIndexReads(), []
    _asked(reads, 1, answers)
    reads.serve([], applied=9, leading_term=4)  # leads again, in a later term
    assert answers == [(0, False)]


def test_a_stop_answers_every_read_not_yet_answered() -> None:
    reads, answers = ReadIndexReads(), []
    context = _asked(reads, 1, answers)
    reads.serve([ReadState(20, context)], applied=1, leading_term=3)  # waiting to apply
    reads.ask(lambda ok: answers.append((9, ok)))  # asked, not sent yet
    reads.fail_all()
    assert sorted(answers) == [(0, False), (9, False)]


def test_contexts_differ_and_are_never_the_cores_own() -> None:
    reads = ReadIndexReads()
    contexts = {reads.take()[0] for _ in range(100)}
    assert len(contexts) == 100
    assert not contexts & {b"", b"quiesce", b"transfer"}
