"""Contract tests for the ordered KV layer: MemoryStore, RocksStore, and Txn over each."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sqsq.core.txn import Txn, prefix_end
from sqsq.shard.store import MemoryStore, RocksStore


def _make(kind: str, tmp_path) -> object:
    if kind == "memory":
        return MemoryStore()
    return RocksStore(str(tmp_path / "db"))


@pytest.fixture(params=["memory", "rocks"])
def store(request, tmp_path) -> Iterator[object]:
    s = _make(request.param, tmp_path)
    yield s
    s.close()


class TxnCommitting:
    """Adapter: a Txn over a store exposing the Store contract. `write` goes into
    the Txn buffer, so the same contract tests exercise read-your-writes."""

    def __init__(self, base) -> None:
        self.base = base
        self.txn = Txn(base)

    def get(self, key):
        return self.txn.get(key)

    def scan(self, start, end, *, reverse=False):
        return self.txn.scan(start, end, reverse=reverse)

    def write(self, writes, *, sync):
        for k, v in writes.items():
            if v is None:
                self.txn.delete(k)
            else:
                self.txn.put(k, v)

    def close(self):
        self.base.close()


@pytest.fixture(params=["memory", "rocks", "txn-memory", "txn-rocks"])
def kv(request, tmp_path) -> Iterator[object]:
    """Anything with get/scan/write: both stores, and a Txn layered on each (with
    base data written under half of it so merges are exercised)."""
    kind = request.param
    if kind.startswith("txn-"):
        s = TxnCommitting(_make(kind[4:], tmp_path))
    else:
        s = _make(kind, tmp_path)
    yield s
    s.close()


def keys(it) -> list[bytes]:
    return [k for k, _ in it]


# -------------------------------------------------------------------- basics


def test_get_put_delete(kv) -> None:
    assert kv.get(b"a") is None
    kv.write({b"a": b"1"}, sync=False)
    assert kv.get(b"a") == b"1"
    kv.write({b"a": b"2"}, sync=True)
    assert kv.get(b"a") == b"2"
    kv.write({b"a": None}, sync=False)
    assert kv.get(b"a") is None
    kv.write({b"zz": None}, sync=False)  # deleting a missing key is fine
    kv.write({b"": b"empty-key", b"e": b""}, sync=False)
    assert kv.get(b"") == b"empty-key"
    assert kv.get(b"e") == b""


def test_batch_mixed_puts_and_deletes(kv) -> None:
    kv.write({b"a": b"1", b"b": b"2", b"c": b"3"}, sync=False)
    kv.write({b"a": None, b"b": b"22", b"d": b"4"}, sync=True)
    assert list(kv.scan(b"", b"\xff")) == [(b"b", b"22"), (b"c", b"3"), (b"d", b"4")]


def test_rocks_batch_is_atomic_on_error(tmp_path) -> None:
    # a bad entry fails while the batch is built, so no part of it lands
    store = RocksStore(str(tmp_path / "db"))
    try:
        store.write({b"a": b"1"}, sync=False)
        with pytest.raises(ValueError):
            store.write({b"a": b"2", b"b": 3}, sync=False)  # type: ignore[dict-item]
        assert store.get(b"a") == b"1"
        assert store.get(b"b") is None
    finally:
        store.close()


def test_scan_bounds_forward_and_reverse(kv) -> None:
    data = {bytes([i]): bytes([i]) * 2 for i in range(0, 256, 16)}
    data[b"\x20\x00"] = b"x"
    data[b"\xff\xff"] = b"y"
    kv.write(data, sync=False)
    exp = sorted(k for k in data if b"\x20" <= k < b"\x60")
    assert keys(kv.scan(b"\x20", b"\x60")) == exp
    assert keys(kv.scan(b"\x20", b"\x60", reverse=True)) == exp[::-1]
    assert keys(kv.scan(b"\x21", b"\x30")) == []
    assert keys(kv.scan(b"\x60", b"\x20")) == []
    assert keys(kv.scan(b"\x20", b"\x20")) == []
    assert keys(kv.scan(b"", b"\xff\xff\xff")) == sorted(data)
    assert keys(kv.scan(b"", b"\xff\xff\xff", reverse=True)) == sorted(data, reverse=True)
    assert keys(kv.scan(b"\xf0", b"\xff\xff")) == [b"\xf0"]
    # values come with keys
    assert dict(kv.scan(b"", b"\xff\xff\xff")) == data


def test_scan_prefix(kv) -> None:
    kv.write(
        {b"q/a/1": b"", b"q/a/2": b"", b"q/a\xff": b"", b"q/b/1": b"", b"q/a": b""}, sync=False
    )
    assert keys(kv.scan(b"q/a/", prefix_end(b"q/a/"))) == [b"q/a/1", b"q/a/2"]
    assert keys(kv.scan(b"q/a", prefix_end(b"q/a"))) == [b"q/a", b"q/a/1", b"q/a/2", b"q/a\xff"]


def test_scan_is_lazy_and_survives_writes(kv) -> None:
    kv.write({b"k%03d" % i: b"v" for i in range(100)}, sync=False)
    it = kv.scan(b"k", prefix_end(b"k"))
    assert next(it)[0] == b"k000"
    kv.write({b"k050": None, b"k200": b"new"}, sync=False)
    rest = keys(it)  # must not crash; seeing the write is optional
    assert rest[0] == b"k001"
    assert set(rest) >= {b"k%03d" % i for i in range(1, 100) if i != 50}
    # a scan started after the write sees it
    after = keys(kv.scan(b"k", prefix_end(b"k")))
    assert b"k050" not in after and after[-1] == b"k200"


def test_prefix_end() -> None:
    assert prefix_end(b"a") == b"b"
    assert prefix_end(b"q/a/") == b"q/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"a\xfe\xff\xff") == b"a\xff"
    assert prefix_end(b"\x00") == b"\x01"
    for p in (b"a", b"a\xff", b"ab\xff\xff", b"\x00\xff"):
        e = prefix_end(p)
        assert e > p + b"\xff" * 10
        assert not e.startswith(p)
    with pytest.raises(ValueError):
        prefix_end(b"\xff\xff")
    with pytest.raises(ValueError):
        prefix_end(b"")


# ----------------------------------------------------------------------- Txn


def test_txn_read_your_writes_and_isolation(store) -> None:
    store.write({b"a": b"1", b"b": b"2", b"c": b"3"}, sync=False)
    t = Txn(store)
    t.put(b"b", b"22")
    t.put(b"bb", b"new")
    t.delete(b"c")
    t.delete(b"nope")
    assert t.get(b"a") == b"1"
    assert t.get(b"b") == b"22"
    assert t.get(b"c") is None
    assert t.get(b"bb") == b"new"
    assert list(t.scan(b"", b"z")) == [(b"a", b"1"), (b"b", b"22"), (b"bb", b"new")]
    assert list(t.scan(b"", b"z", reverse=True)) == [(b"bb", b"new"), (b"b", b"22"), (b"a", b"1")]
    # nothing reached the store
    assert store.get(b"b") == b"2" and store.get(b"c") == b"3" and store.get(b"bb") is None
    assert len(t) == 4
    w = t.writes()
    assert w == {b"b": b"22", b"bb": b"new", b"c": None, b"nope": None}
    store.write(w, sync=True)
    assert list(store.scan(b"", b"z")) == [(b"a", b"1"), (b"b", b"22"), (b"bb", b"new")]


def test_txn_delete_hides_base_everywhere(store) -> None:
    store.write({b"k%02d" % i: b"base" for i in range(20)}, sync=False)
    t = Txn(store)
    for i in range(0, 20, 2):
        t.delete(b"k%02d" % i)
    t.put(b"k05", b"ov")
    exp = [b"k%02d" % i for i in range(1, 20, 2)]
    assert keys(t.scan(b"k", b"l")) == exp
    assert keys(t.scan(b"k", b"l", reverse=True)) == exp[::-1]
    assert dict(t.scan(b"k", b"l"))[b"k05"] == b"ov"
    # re-put after delete resurrects with the new value
    t.put(b"k00", b"again")
    assert next(iter(t.scan(b"k", b"l"))) == (b"k00", b"again")


@pytest.mark.parametrize("reverse", [False, True])
def test_txn_scan_while_mutating(store, reverse: bool) -> None:
    store.write({b"k%02d" % i: b"base" for i in range(0, 20, 2)}, sync=False)
    t = Txn(store)
    for i in range(1, 20, 2):
        t.put(b"k%02d" % i, b"ov")
    seen = []
    for k, _ in t.scan(b"k", b"l", reverse=reverse):
        seen.append(k)
        n = int(k[1:])
        # delete the next two keys ahead (one overlay, one base), and the one just seen
        step = -1 if reverse else 1
        t.delete(b"k%02d" % (n + step))
        t.delete(b"k%02d" % (n + 2 * step))
        t.delete(k)
        # rewrite a key behind the cursor: must not be revisited
        t.put(b"k%02d" % (n - step), b"behind")
    exp = [b"k%02d" % i for i in (range(0, 20, 3) if not reverse else range(19, -1, -3))]
    assert seen == exp
    # put ahead during iteration is seen
    t2 = Txn(store)
    out = []
    for k, _ in t2.scan(b"k", b"l"):
        out.append(k)
        if k == b"k00":
            t2.put(b"k03", b"x")
            t2.put(b"k02", b"changed")
    assert out[:3] == [b"k00", b"k02", b"k03"]
    assert t2.get(b"k02") == b"changed"


def test_txn_savepoint_rollback(store) -> None:
    store.write({b"a": b"1", b"b": b"2"}, sync=False)
    t = Txn(store)
    t.put(b"a", b"10")
    sp1 = t.savepoint()
    t.put(b"a", b"100")
    t.delete(b"b")
    t.put(b"c", b"3")
    sp2 = t.savepoint()
    t.put(b"d", b"4")
    t.rollback(sp2)
    assert t.writes() == {b"a": b"100", b"b": None, b"c": b"3"}
    t.rollback(sp1)
    assert t.writes() == {b"a": b"10"}
    assert list(t.scan(b"", b"z")) == [(b"a", b"10"), (b"b", b"2")]
    assert len(t) == 1
    # sp1 stays usable; sp2 was invalidated by rolling back past it
    t.put(b"e", b"5")
    t.rollback(sp1)
    assert t.writes() == {b"a": b"10"}
    with pytest.raises(ValueError):
        t.rollback(sp2)
    with pytest.raises(ValueError):
        Txn(store).rollback(sp1)
    # rollback to a savepoint taken on an empty txn empties it
    t3 = Txn(store)
    sp = t3.savepoint()
    t3.put(b"x", b"1")
    t3.delete(b"a")
    t3.rollback(sp)
    assert t3.writes() == {} and len(t3) == 0 and t3.get(b"a") == b"1"


def test_txn_over_txn(store) -> None:
    # a Txn is itself a KVReader, so nested overlays compose
    store.write({b"a": b"1", b"b": b"2"}, sync=False)
    outer = Txn(store)
    outer.delete(b"a")
    inner = Txn(outer)
    inner.put(b"c", b"3")
    assert list(inner.scan(b"", b"z")) == [(b"b", b"2"), (b"c", b"3")]


# ------------------------------------------------------ durability, checkpoint


def test_rocks_persistence_across_reopen(tmp_path) -> None:
    path = str(tmp_path / "db")
    s = RocksStore(path)
    s.write({b"a": b"1", b"b": b"2"}, sync=True)
    s.write({b"a": None}, sync=False)
    s.close()
    s.close()  # idempotent
    s = RocksStore(path)
    try:
        assert s.get(b"a") is None
        assert list(s.scan(b"", b"z")) == [(b"b", b"2")]
    finally:
        s.close()


def test_checkpoint_roundtrip(store, tmp_path) -> None:
    data = {b"k%04d" % i: os.urandom(i % 50) for i in range(500)}
    data[b""] = b""
    data[b"\xff" * 3] = b"\x00" * 3
    store.write(data, sync=True)
    cp = str(tmp_path / "cp")
    store.checkpoint(cp)
    store.write({b"k0000": None, b"later": b"x"}, sync=False)  # after the checkpoint
    with pytest.raises(FileExistsError):
        store.checkpoint(cp)  # target must not exist
    copy = MemoryStore.load(cp) if isinstance(store, MemoryStore) else RocksStore(cp)
    try:
        assert dict(copy.scan(b"", b"\xff" * 4)) == data
        assert copy.get(b"later") is None
        copy.write({b"new": b"1"}, sync=True)  # the copy is a live, writable store
        assert copy.get(b"new") == b"1"
    finally:
        copy.close()
    assert store.get(b"new") is None


def test_memory_load_rejects_garbage(tmp_path) -> None:
    p = tmp_path / "bad"
    p.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError):
        MemoryStore.load(str(p))


# ------------------------------------------------------------------ hypothesis

_key = st.binary(min_size=0, max_size=3).map(lambda b: b.replace(b"\x03", b"\xff"))
_op = st.one_of(
    st.tuples(st.just("put"), _key, st.binary(max_size=2)),
    st.tuples(st.just("del"), _key, st.none()),
    st.tuples(st.just("sp"), st.none(), st.none()),
    st.tuples(st.just("rb"), st.none(), st.none()),
)


@pytest.mark.parametrize("kind", ["memory", "rocks"])
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    base=st.dictionaries(_key, st.binary(max_size=2), max_size=20),
    ops=st.lists(_op, max_size=30),
    bounds=st.lists(st.tuples(_key, _key), min_size=1, max_size=4),
)
def test_txn_matches_dict_model(kind, tmp_path, base, ops, bounds) -> None:
    if kind == "memory":
        s = MemoryStore()
    else:
        s = RocksStore(str(tmp_path / f"h{os.urandom(6).hex()}"))
    try:
        s.write(base, sync=False)
        t = Txn(s)
        model = dict(base)
        stack: list[tuple[object, dict]] = []
        for op, k, v in ops:
            if op == "put":
                t.put(k, v)
                model[k] = v
            elif op == "del":
                t.delete(k)
                model.pop(k, None)
            elif op == "sp":
                stack.append((t.savepoint(), dict(model)))
            elif stack:
                sp, snap = stack.pop()
                t.rollback(sp)
                model = snap
        for lo, hi in bounds:
            exp = sorted((k, v) for k, v in model.items() if lo <= k < hi)
            assert list(t.scan(lo, hi)) == exp
            assert list(t.scan(lo, hi, reverse=True)) == exp[::-1]
        for k in list(model) + [b"\x00", b"zz"]:
            assert t.get(k) == model.get(k)
        # committing the writes makes the store equal the model
        s.write(t.writes(), sync=False)
        assert list(s.scan(b"", b"\xff" * 4)) == sorted(model.items())
    finally:
        s.close()
