"""A send's request id is its idempotency key on the server: two sends must never share one,
in one process or across a fork (a forked load generator's children each send)."""

from __future__ import annotations

import os

from sqsq.client import _convert, _ops


def test_request_ids_are_32_hex_digits_and_never_repeat() -> None:
    ids = [_convert.request_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert _ops.send_message("q", "body").request.request_id != \
        _ops.send_message("q", "body").request.request_id


def test_a_forked_child_never_repeats_its_parents_ids() -> None:
    _convert.request_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write, ",".join(_convert.request_id() for _ in range(3)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = f.read().split(",")
    os.waitpid(pid, 0)
    parent = [_convert.request_id() for _ in range(3)]
    assert len(child) == 3
    assert not set(child) & set(parent)
    assert child[0][:16] != parent[0][:16]  # a prefix of its own
