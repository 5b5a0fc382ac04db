"""The leader's stamp (``sqsq.shard.stamp``): the random values it puts into commands."""

from __future__ import annotations

import uuid

from sqsq.core import commands as c
from sqsq.shard.stamp import message_ids, stamp


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


def test_the_random_pool_never_hands_out_the_same_bytes_twice_across_refills() -> None:
    from sqsq.shard.stamp import RandomPool

    pool = RandomPool(read_size=64)
    pieces = [pool.take(16) for _ in range(40)] + [pool.take(100), pool.take(8)]
    assert [len(p) for p in pieces] == [16] * 40 + [100, 8]
    assert len(set(pieces)) == len(pieces)  # 128-bit pieces: a repeat would be the pool's


def test_receives_get_distinct_nonces() -> None:
    nonces = {stamp(c.ReceiveMessages("q")).nonce for _ in range(1000)}
    assert len(nonces) == 1000 and all(0 <= n < 2**64 for n in nonces)


def test_message_ids_keep_every_random_bit_but_the_version_and_variant() -> None:
    from sqsq.shard.stamp import MessageIdPool

    ids = [i for _ in range(10) for i in MessageIdPool(per_read=64).take(100)]  # refills
    assert len(set(ids)) == 1000
    assert {i[19] for i in ids} == set("89ab")  # the variant's two random bits
    for pos in (0, 15, 20, 35):  # random digits elsewhere take all 16 values
        assert len({i[pos] for i in ids}) == 16
    assert {i[14] for i in ids} == {"4"}  # the version
