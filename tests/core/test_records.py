"""Record encoding: strings come back as str and bytes as bytes, whatever msgpack's defaults."""

from __future__ import annotations

from sqsq.core import records as r
from sqsq.core.messages import MessageAttributeValue


def test_unpack_gives_strings_as_str_and_bytes_as_bytes() -> None:
    assert r.unpack(r.pack(["é", b"\x00\xff", None, 2**63, [1]])) == ["é", b"\x00\xff", None,
                                                                       2**63, [1]]


def test_records_round_trip() -> None:
    m = r.MessageRecord("id", "body é", (("a", MessageAttributeValue("Binary", None, b"\x01")),),
                        5, "md5", "md5a", "g", "dedup", "arn", 7, "trace")
    assert r.MessageRecord.decode(m.encode()) == m
    assert m.encode() == r.MessageRecord.encode_fields(
        "id", "body é", (("a", MessageAttributeValue("Binary", None, b"\x01")),), 5, "md5",
        "md5a", "g", "dedup", "arn", 7, "trace")
    d = r.Delivery(2, 10, 1, 3, "g", 4, 6)
    assert r.Delivery.decode(d.encode()) == d
    g = r.GroupRecord(1, b"k\x00", 3, 4)
    assert r.GroupRecord.decode(g.encode()) == g
    u = r.DedupRecord("id", None, "md5", None, 9)
    assert r.DedupRecord.decode(u.encode()) == u
    assert u.encode() == r.DedupRecord.encode_fields("id", None, "md5", None, 9)
