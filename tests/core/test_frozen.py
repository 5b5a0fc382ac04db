"""``quick_init``: a frozen dataclass built through its quicker ``__init__`` is the instance
the generated one would have built."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from sqsq.core import commands as c
from sqsq.core.entry import Entry
from sqsq.core.messages import MessageAttributeValue
from sqsq.frozen import quick_init


def twin(cls: type) -> type:
    """The same class as ``dataclass(frozen=True)`` alone makes it."""
    return dataclass(frozen=True)(type(cls.__name__, (), {
        "__annotations__": {f.name: f.type for f in dataclasses.fields(cls)},
        **{f.name: f.default for f in dataclasses.fields(cls)
           if f.default is not dataclasses.MISSING},
        "__module__": cls.__module__,
    }))


CASES = [
    (c.SendEntry, ("e1", "body"), {"delay_seconds": 5, "message_group_id": "g"}),
    (c.SendMessages, ("q", ()), {"request_id": "r"}),
    (c.ReceiveMessages, ("q",), {"nonce": 7}),
    (c.DeleteMessages, ("q", (("1", "h"),)), {}),
    (c.ChangeVisibilities, ("q", (("1", "h", 3),)), {}),
    (c.SentMessage, ("1", "m", "md5", None, None), {}),
    (c.EntryFailed, ("1", None), {}),
    (c.BatchResult, (), {"failed": ()}),
    (c.ReceivedMessage, ("m", "h", "b", "md5", None, (), ()), {}),
    (c.Received, ((),), {}),
    (c.WakeReceivers, ("q",), {}),
    (c.Outcome, (c.Ok(),), {}),
    (MessageAttributeValue, ("String",), {"string_value": "v"}),
    (Entry, (5, ()), {}),
]


@pytest.mark.parametrize(("cls", "args", "kwargs"), CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_instances_are_what_the_generated_init_builds(cls: type, args: tuple, kwargs: dict) -> None:
    plain = twin(cls)
    for a, kw in ((args, kwargs), (args, {})):
        quick, reference = cls(*a, **kw), plain(*a, **kw)
        assert vars(quick) == vars(reference)
        assert repr(quick) == repr(reference)
        assert quick == cls(*a, **kw) and hash(quick) == hash(cls(*a, **kw))
        with pytest.raises(dataclasses.FrozenInstanceError):
            quick.x = 1  # type: ignore[attr-defined]
        first = dataclasses.fields(cls)[0].name
        assert dataclasses.replace(quick, **{first: args[0] if args else ()}) == quick
    with pytest.raises(TypeError):
        cls(*args, no_such_field=1)


def test_refuses_what_it_would_get_wrong() -> None:
    @dataclass
    class Mutable:
        a: int

    @dataclass(frozen=True)
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (Mutable, Post):
        with pytest.raises(TypeError):
            quick_init(cls)


def test_a_default_factory_gives_each_instance_a_value_of_its_own() -> None:
    @quick_init
    @dataclass(frozen=True)
    class Factory:
        a: int
        b: list = field(default_factory=list)
        c: str = "c"

    @dataclass(frozen=True)
    class Reference:
        a: int
        b: list = field(default_factory=list)
        c: str = "c"

    one, two = Factory(1), Factory(1)
    assert vars(one) == vars(Reference(1)) == {"a": 1, "b": [], "c": "c"}
    assert one.b is not two.b
    given = [5]
    assert Factory(2, given).b is given and vars(Factory(2, given, "x")) == vars(
        Reference(2, given, "x"))
    assert Factory(3, c="z") == Factory(3, [], "z")
