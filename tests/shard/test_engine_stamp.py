"""The leader's stamp: the random values it puts into commands."""

from __future__ import annotations

import uuid

from sqsq.core import commands as c
from sqsq.shard.engine import message_ids, stamp


def test_message_ids_are_distinct_version_4_uuids_in_canonical_text() -> None:
    ids = message_ids(1000)
    assert len(set(ids)) == 1000
    for text in ids:
        u = uuid.UUID(text)
        assert str(u) == text  # lower-case hex, 8-4-4-4-12
        assert u.version == 4 and u.variant == uuid.RFC_4122


def test_stamp_gives_each_send_entry_its_own_id() -> None:
    cmd = stamp(c.SendMessages("q", tuple(c.SendEntry(str(i), "b") for i in range(10)), "r"))
    assert isinstance(cmd, c.SendMessages)
    assert len(cmd.message_ids) == 10 and len(set(cmd.message_ids)) == 10
    assert (cmd.queue, cmd.request_id, len(cmd.entries)) == ("q", "r", 10)
