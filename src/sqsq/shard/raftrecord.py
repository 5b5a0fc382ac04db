"""The Raft log's record format, and how to tell a torn write from damage.

A record is ``[u32 length][u32 crc][payload]`` (little-endian), the payload msgpack
``[index, term, kind, data]`` (never pickle). The crc is zlib's crc32 over the length field
and the payload, so a damaged length is caught as well as damaged data.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

import msgpack

_LEN = struct.Struct("<I")
_HEADER = struct.Struct("<II")  # length, crc
MAX_RECORD_BYTES = 256 << 20  # far above any batch the core sends: a larger length is damage
BASE_KIND = -1  # the kind of the record a reset log starts with: the (index, term) it follows
_SECTOR = 512  # the unit a disk writes whole, or not at all


def checksum(length: bytes | memoryview, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(length))


def encode_record(index: int, term: int, kind: int, data: bytes) -> bytes:
    payload = msgpack.packb([index, term, kind, data], use_bin_type=True)
    length = _LEN.pack(len(payload))
    return length + _LEN.pack(checksum(length, payload)) + payload


class BadRecord(Exception):
    """A record that does not check out, and where."""

    def __init__(self, offset: int, reason: str, end: int | None, length: int = -1) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason
        self.end = end  # where the bad record ends, if its length is believable
        self.length = length


def records(buf: bytes | memoryview, base: int = 0
             ) -> Iterator[tuple[int, int, int, int, bytes]]:
    """(offset, index, term, kind, data) of each record in ``buf`` (which starts at file
    offset ``base``); raises ``BadRecord`` at the first record that does not check out."""
    view = memoryview(buf)
    pos, size = 0, len(view)
    while pos < size:
        if size - pos < _HEADER.size:
            raise BadRecord(base + pos, "a record header cut short", base + size)
        length, crc = _HEADER.unpack_from(view, pos)
        if length == 0 or length > MAX_RECORD_BYTES:
            raise BadRecord(base + pos, f"an impossible record length {length}", None, length)
        end = pos + _HEADER.size + length
        if end > size:
            raise BadRecord(base + pos, "a record cut short", base + size)
        payload = view[pos + _HEADER.size:end]
        if checksum(view[pos:pos + _LEN.size], payload) != crc:
            raise BadRecord(base + pos, "a bad checksum", base + end)
        try:
            index, term, kind, data = msgpack.unpackb(payload, raw=False)
            if not (isinstance(index, int) and isinstance(term, int)
                    and isinstance(kind, int) and isinstance(data, bytes)):
                raise ValueError("bad field types")
        except Exception as exc:  # a checksummed record that does not decode: a bug or damage
            raise BadRecord(base + pos, f"an undecodable record ({exc})", base + end) from None
        yield base + pos, index, term, kind, data
        pos = end


def is_torn(buf: bytes, bad: BadRecord) -> bool:
    """Whether a bad record in the last segment is what a cut-short write leaves (etcd's WAL
    decides much the same way): a header of zeros (the end of what was written, in a
    preallocated file or one that grew without its data), a record after which nothing was
    written (the file ends, or only zeros follow), or a record with a disk sector that reads
    back as zeros (never written). Anything else is damage to data that may have been synced,
    with more records after it: refuse it rather than cut them off."""
    if bad.length == 0:
        return True
    end = bad.end if bad.end is not None else bad.offset + _HEADER.size
    if end >= len(buf) or buf.count(0, end) == len(buf) - end:
        return True
    if bad.end is None:
        return False  # an impossible length with data after it
    lo = bad.offset
    while lo < bad.end:
        hi = min(bad.end, (lo // _SECTOR + 1) * _SECTOR)
        if buf.count(0, lo, hi) == hi - lo:
            return True
        lo = hi
    return False
