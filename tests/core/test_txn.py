"""The Txn keeps its overlay's keys unsorted until something needs their order (a scan, a
rollback, the writes): whatever comes first, every answer is the sorted one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedDict

from sqsq.core.txn import Txn


class DictStore:
    def __init__(self, items: dict[bytes, bytes]) -> None:
        self.d = SortedDict(items)

    def get(self, key: bytes) -> bytes | None:
        return self.d.get(key)

    def scan(self, start: bytes, end: bytes, *, reverse: bool = False):  # type: ignore[no-untyped-def]
        for k in list(self.d.irange(start, end, (True, False), reverse)):
            yield k, self.d[k]


_key = st.binary(min_size=1, max_size=3)
_op = st.one_of(
    st.tuples(st.just("put"), _key, st.binary(max_size=2)),
    st.tuples(st.just("del"), _key, st.none()),
    st.tuples(st.just("scan"), _key, _key),
    st.tuples(st.just("sp"), st.none(), st.none()),
    st.tuples(st.just("rb"), st.none(), st.none()),
)


@settings(max_examples=300, deadline=None)
@given(base=st.dictionaries(_key, st.binary(max_size=2), max_size=10),
       ops=st.lists(_op, max_size=40))
def test_answers_are_sorted_whenever_asked(base: dict, ops: list) -> None:
    t = Txn(DictStore(base))
    model, written = dict(base), {}
    stack: list[tuple[object, dict, dict]] = []
    for op, a, b in ops:
        if op == "put":
            t.put(a, b)
            model[a] = written[a] = b
        elif op == "del":
            t.delete(a)
            model.pop(a, None)
            written[a] = None
        elif op == "scan":
            lo, hi = min(a, b), max(a, b)
            exp = sorted((k, v) for k, v in model.items() if lo <= k < hi)
            assert list(t.scan(lo, hi)) == exp
            assert list(t.scan(lo, hi, reverse=True)) == exp[::-1]
        elif op == "sp":
            stack.append((t.savepoint(), dict(model), dict(written)))
        elif stack:
            sp, model, written = stack.pop()
            t.rollback(sp)
    assert list(t.writes().items()) == sorted(written.items())


def test_a_scan_sees_keys_put_before_it_and_ahead_of_its_cursor() -> None:
    t = Txn(DictStore({b"b": b"1", b"d": b"1"}))
    for k in (b"e", b"a", b"c"):  # out of order, before any scan
        t.put(k, b"2")
    seen = []
    for k, _ in t.scan(b"a", b"z"):
        seen.append(k)
        if k == b"b":
            t.put(b"bb", b"3")  # ahead of the cursor: seen
            t.put(b"a0", b"3")  # behind it: not
    assert seen == [b"a", b"b", b"bb", b"c", b"d", b"e"]
    assert list(t.writes()) == [b"a", b"a0", b"bb", b"c", b"e"]


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_runs_of_deleted_keys_skipped_by_later_scans_hide_nothing(data: st.DataObject) -> None:
    """Receives take an index's keys from the front, entry after entry: later scans jump over
    what earlier ones deleted. Whatever is put, deleted or rolled back in between, each scan
    still answers exactly what is there."""
    base = {bytes([1, i]): b"b" for i in range(0, 60, 2)}
    t = Txn(DictStore(base))
    model = dict(base)
    stack: list[tuple[object, dict]] = []
    for _ in range(data.draw(st.integers(1, 12))):
        lo = bytes([1, data.draw(st.integers(0, 30))])
        expected = sorted((k, v) for k, v in model.items() if lo <= k < b"\x02")
        take = data.draw(st.integers(0, 8))
        scanned = []
        for k, v in t.scan(lo, b"\x02"):  # take some from the front, as a receive does
            scanned.append((k, v))
            if len(scanned) <= take:
                t.delete(k)
                model.pop(k)
        assert scanned == expected
        for _ in range(data.draw(st.integers(0, 2))):
            k = bytes([1, data.draw(st.integers(0, 60))])
            if data.draw(st.booleans()):
                t.put(k, b"p")
                model[k] = b"p"
            else:
                t.delete(k)
                model.pop(k, None)
        action = data.draw(st.sampled_from(["none", "none", "sp", "rb"]))
        if action == "sp":
            stack.append((t.savepoint(), dict(model)))
        elif action == "rb" and stack:
            sp, model = stack.pop()
            t.rollback(sp)
    assert list(t.scan(b"\x01", b"\x02")) == sorted(model.items())


def test_scans_from_the_same_start_open_the_base_past_what_earlier_ones_took() -> None:
    """The receives of one entry each scan the visible index from its floor and take its
    first message: each opens one base iterator, at the first key still there (not at the
    first taken one, then again after the keys taken)."""
    opened: list[bytes] = []

    class Counting(DictStore):
        def scan(self, start: bytes, end: bytes, *, reverse: bool = False):  # type: ignore[no-untyped-def]
            opened.append(start)
            return super().scan(start, end, reverse=reverse)

    t = Txn(Counting({bytes([1, i]): b"b" for i in range(1, 21)}))
    for i in range(1, 11):
        k, _ = next(iter(t.scan(b"\x01", b"\x02")))
        assert k == bytes([1, i])
        t.delete(k)
    assert len(opened) == 10
    assert list(t.scan(b"\x01", b"\x02")) == [(bytes([1, i]), b"b") for i in range(11, 21)]
