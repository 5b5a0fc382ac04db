"""Reads served by ReadIndex (Raft's section 6.4), the host's half: a read is answered
without a log entry once the leader has confirmed with a quorum that it still leads (the
core's heartbeat round, ``RaftNode.read_index``) and has applied everything committed when
the read was asked.

``ReadIndexReads`` keeps the bookkeeping between asking and answering; the replica calls it
on the event loop. Reads asked in one turn of the loop share one context, so one heartbeat
round confirms them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sqsq.raft import ReadState

Confirmed = Callable[[bool], None]  # True: the read may be served now; False: not leading


class ReadIndexReads:
    def __init__(self) -> None:
        self._asked: list[Confirmed] = []  # this turn of the loop: not yet sent to the core
        self._out: dict[bytes, tuple[int, list[Confirmed]]] = {}  # by context: (term, ...)
        self._confirmed: list[tuple[int, list[Confirmed]]] = []  # (read index, ...)
        self._seq = 0

    def ask(self, done: Confirmed) -> bool:
        """Queue a read; True if it is the turn's first (the caller schedules ``take``)."""
        self._asked.append(done)
        return len(self._asked) == 1

    def take(self) -> tuple[bytes, list[Confirmed]]:
        """The turn's reads and a fresh context for them (never the core's QUIESCE or
        TRANSFER)."""
        asked, self._asked = self._asked, []
        self._seq += 1
        return b"r" + self._seq.to_bytes(8, "big"), asked

    def sent(self, context: bytes, term: int, reads: list[Confirmed]) -> None:
        self._out[context] = (term, reads)

    @property
    def out(self) -> bool:
        return bool(self._out)

    @property
    def waiting(self) -> bool:
        """Confirmed reads that wait for the state machine to apply their index."""
        return bool(self._confirmed)

    def serve(self, states: Iterable[ReadState], applied: int,
              leading_term: int | None) -> None:
        """Confirmed read states join the reads waiting for the apply; those whose index is
        applied are answered True. Reads still out whose term is not the one this replica
        leads in were dropped by the core with its leadership: answered False."""
        for rs in states:
            out = self._out.pop(rs.context, None)
            if out is not None:
                self._confirmed.append((rs.index, out[1]))
        if self._confirmed:
            waiting, self._confirmed = self._confirmed, []
            for index, reads in waiting:
                if index <= applied:
                    _answer(reads, True)
                else:
                    self._confirmed.append((index, reads))
        for context, (term, reads) in list(self._out.items()):
            if term != leading_term:
                del self._out[context]
                _answer(reads, False)

    def fail_all(self) -> None:
        """Stopping: every read not yet answered is answered False."""
        reads = self._asked + [d for _, ds in self._out.values() for d in ds] + \
            [d for _, ds in self._confirmed for d in ds]
        self._asked, self._out, self._confirmed = [], {}, []
        _answer(reads, False)


def _answer(reads: list[Confirmed], ok: bool) -> None:
    for done in reads:
        done(ok)
