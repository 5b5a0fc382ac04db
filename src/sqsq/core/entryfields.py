"""The field kinds of the Raft log entry's codec (``sqsq.core.entry``): each checks one value
of a command's field and converts it to or from its wire form (msgpack's plain values), and
``Record`` lays a dataclass out as the array of its fields in declaration order, with the
fast path ``core.fastcodec`` generates for it. Both directions check, so the leader cannot
propose what its replicas would refuse."""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter, call
from typing import Any, NamedTuple

from sqsq.core.fastcodec import generate

INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1  # what a msgpack int can carry


def bad(expected: str, got: object) -> ValueError:
    return ValueError(f"expected {expected}, got {type(got).__name__} {got!r:.80}")


class Kind(NamedTuple):
    enc: Callable[[Any], Any]  # dataclass value -> wire value (lists, tuples, scalars)
    dec: Callable[[Any], Any]  # wire value (arrays unpacked as tuples) -> dataclass value
    # The fast path (``core.fastcodec``): the exact types a value may have there,
    # the same both ways, and what converts a non-empty tuple of them each way (None: the
    # value is its own form, its type says all).
    types: tuple[type, ...] = ()
    fast_enc: Callable[[Any], Any] | None = None
    fast_dec: Callable[[Any], Any] | None = None


def _plain(check: Callable[[Any], Any], *types: type, tuples: bool = False) -> Kind:
    """A kind whose wire form is the value itself: the same check serves both ways (and on
    the fast path too for a tuple's items, which their container's type does not vouch
    for)."""
    fast = check if tuples else None
    return Kind(check, check, types, fast, fast)


def check_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise bad("str", v)


def _int(v: Any) -> int:
    if type(v) is int and INT_MIN <= v <= INT_MAX:  # type(): a bool is not an int here
        return v
    raise bad("a 64-bit int", v)


def _opt_str(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    raise bad("str or None", v)


def _opt_int(v: Any) -> int | None:
    return None if v is None else _int(v)


def _opt_bytes(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    raise bad("bytes or None", v)


def _strs(v: Any) -> tuple[str, ...]:
    if type(v) is not tuple:
        raise bad("a tuple of str", v)
    for s in v:
        if not isinstance(s, str):
            raise bad("str", s)
    return v


def _str_pairs(v: Any) -> tuple[tuple[str, str], ...]:
    if type(v) is not tuple:
        raise bad("a tuple of (str, str)", v)
    for p in v:
        if type(p) is not tuple or len(p) != 2 or not isinstance(p[0], str) \
                or not isinstance(p[1], str):
            raise bad("a (str, str)", p)
    return v


def _visibility_changes(v: Any) -> tuple[tuple[str, str, int], ...]:
    if type(v) is not tuple:
        raise bad("a tuple of (entry id, receipt handle, timeout s)", v)
    for p in v:
        if type(p) is not tuple or len(p) != 3 or not isinstance(p[0], str) \
                or not isinstance(p[1], str):
            raise bad("a (str, str, int)", p)
        _int(p[2])
    return v


_NONE = type(None)
STR, INT = _plain(check_str, str), _plain(_int, int)
OPT_STR, OPT_INT = _plain(_opt_str, str, _NONE), _plain(_opt_int, int, _NONE)
OPT_BYTES = _plain(_opt_bytes, bytes, _NONE)
STRS, STR_PAIRS, VISIBILITY_CHANGES = (
    _plain(check, tuple, tuples=True) for check in (_strs, _str_pairs, _visibility_changes))


def _values_getter(names: tuple[str, ...]) -> Callable[[Any], tuple]:
    """One C call that returns a record's field values as a tuple, in order."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        get_one = attrgetter(names[0])
        return lambda obj: (get_one(obj),)
    return attrgetter(*names)


class Record:
    """A dataclass as the array of its fields, in declaration order."""

    def __init__(self, cls: type, *fields: tuple[str, Kind]) -> None:
        self.cls = cls
        self.fields = fields
        self.names = tuple(name for name, _ in fields)
        self._encs = tuple(kind.enc for _, kind in fields)
        self._decs = tuple(kind.dec for _, kind in fields)
        self._values = _values_getter(self.names)
        self.fast_enc = self.fast(encode=True)
        self.fast_dec = self.fast(encode=False)

    def enc(self, obj: Any) -> list:
        if type(obj) is not self.cls:
            raise bad(self.cls.__name__, obj)
        values = self._values(obj)
        try:
            return list(map(call, self._encs, values))  # map(call): the loop runs in C
        except ValueError as e:
            raise self._blame(self._encs, values, e) from e

    def dec(self, wire: Any) -> Any:
        if type(wire) is not tuple or len(wire) != len(self.names):
            raise ValueError(f"expected {self.cls.__name__} as {len(self.names)} fields "
                             f"{list(self.names)}, got {wire!r:.80}")
        try:
            return self.cls(*map(call, self._decs, wire))
        except ValueError as e:
            raise self._blame(self._decs, wire, e) from e

    def fast(self, encode: bool, tag: int | None = None) -> Callable[[Any], Any]:
        kinds = [kind for _, kind in self.fields]
        return generate(self.cls, self._values, [kind.types for kind in kinds],
                        [kind.fast_enc if encode else kind.fast_dec for kind in kinds],
                        encode=encode, tag=tag)

    def kind(self) -> Kind:
        """(As a tuple's item: a record is no field of its own.)"""
        return Kind(self.enc, self.dec, (), self.fast_enc, self.fast_dec)

    def _blame(self, fns: tuple, values: tuple, err: ValueError) -> ValueError:
        """Which field failed (the error path only: the happy path does not track it)."""
        for name, fn, v in zip(self.names, fns, values, strict=True):
            try:
                fn(v)
            except ValueError as e:
                return ValueError(f"{self.cls.__name__}.{name}: {e}")
        return err


def tuple_of(item: Kind, what: str) -> Kind:
    def enc(v: Any) -> list:
        if type(v) is not tuple:
            raise bad(f"a tuple of {what}", v)
        return [item.enc(x) for x in v]

    def dec(v: Any) -> tuple:
        if type(v) is not tuple:
            raise bad(f"a tuple of {what}", v)
        return tuple([item.dec(x) for x in v])

    item_enc, item_dec = item.fast_enc, item.fast_dec
    if item_enc is None or item_dec is None:
        raise ValueError(f"a tuple of {what}: its items need a fast form")

    def fast_enc(v: tuple) -> tuple:
        return tuple(map(item_enc, v))

    def fast_dec(v: tuple) -> tuple:
        return tuple(map(item_dec, v))

    return Kind(enc, dec, (tuple,), fast_enc, fast_dec)
