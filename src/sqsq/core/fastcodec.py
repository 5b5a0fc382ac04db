"""The log entry's fast path (``core.entry``): per record, a function generated from its
field table that encodes a record to its wire form, or decodes one, from a look at each
value's exact type.

Every command a leader proposes is encoded, and decoded again by every replica that applies
it; the entry's checked path calls a check function per field and per item. Most values need
no more than ``type(v) is T``: a str field holding a str, an optional int holding None or an
int (msgpack carries exactly the ints the entry allows: the packer refuses the others, and
the unpacker makes no others). One generated expression of such tests costs a fraction of a
call per field, as ``quick_init`` and dataclasses generate their ``__init__`` for the same
reason. What the types do not vouch for raises ``Slow``, and the caller takes the checked
path, which gives the same bytes, record or error as if this path did not exist.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class Slow(Exception):
    """The fast path cannot vouch for a value: the checked path decides (and words the
    error, if there is one)."""


def generate(cls: type, values: Callable[[Any], tuple], types: Sequence[tuple[type, ...]],
             converters: Sequence[Callable[[Any], Any] | None], *, encode: bool,
             tag: int | None = None) -> Callable[[Any], Any]:
    """``cls``'s fast path one way. Encoding: a record (its field values read by ``values``
    as one tuple) to its wire form, ``tag`` first for a command; decoding: that wire form to
    the record. Field i's value must have one of the exact ``types[i]``; ``converters[i]``
    (None: the value is its own form) converts a non-empty tuple, and an empty one is its
    own form both ways. Raises Slow (or the converter's ValueError) when that does not
    suffice."""
    names = [f"v{i}" for i in range(len(types))]
    env: dict[str, Any] = {"cls": cls, "Slow": Slow, "tag": tag, "values": values}
    tests, out, converted = [], [], []
    for i, (v, allowed, convert) in enumerate(zip(names, types, converters, strict=True)):
        if not allowed:
            raise ValueError(f"{cls.__name__}: field {i} has no fast form")
        for j, t in enumerate(allowed):
            env[f"T{i}_{j}"] = t
        tests.append("(" + " or ".join(f"type({v}) is T{i}_{j}"
                                       for j in range(len(allowed))) + ")")
        if convert is None:
            out.append(v)
        else:
            env[f"f{i}"] = convert
            out.append(f"(f{i}({v}) if {v} else {v})")
            converted.append(v)
    lines = ["def fast(obj):"]
    if encode:
        lines += ["    if type(obj) is not cls:", "        raise Slow"]
        if names:
            lines += ["    fields = values(obj)", f"    {', '.join(names)}, = fields"]
    else:
        n = len(names) + (tag is not None)
        lines += [f"    if type(obj) is not tuple or len(obj) != {n}:", "        raise Slow"]
        if names:
            lines.append(f"    {'_, ' if tag is not None else ''}{', '.join(names)}, = obj")
    if tests:
        lines += [f"    if not ({' and '.join(tests)}):", "        raise Slow"]
    if not encode:
        lines.append(f"    return cls({', '.join(out)})")
    elif tag is not None:
        lines.append(f"    return (tag, {''.join(o + ', ' for o in out)})")
    elif not converted:  # (a tuple packs as the array a list does)
        lines.append("    return fields" if names else "    return ()")
    else:
        lines += [f"    if not ({' or '.join(converted)}):", "        return fields",
                  f"    return ({''.join(o + ', ' for o in out)})"]
    namespace: dict[str, Any] = {}
    exec("\n".join(lines) + "\n", env, namespace)  # noqa: S102 - from a record's own table
    return namespace["fast"]
