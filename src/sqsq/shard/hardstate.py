"""A replica's Raft hard state (term, vote, commit) in a file of its own.

The file is ``[u32 length][u32 crc32][msgpack [term, vote, commit]]`` and is only ever
replaced whole (temp file, fsync, rename, directory fsync), so a crash leaves the old hard
state or the new one. A missing file is a new replica. A file that is there but cannot be
read is an error, never an empty hard state: a replica that forgot its vote could vote twice
in one term (pysyncobj treated a read error as an empty file: finding 6).
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import msgpack

from sqsq.raft import HardState
from sqsq.shard.durable import atomic_write

_HEADER = struct.Struct("<II")  # length, crc32 of the payload


class HardStateError(Exception):
    """The hard state file is there but damaged: the replica must not start."""


def encode_hard_state(hs: HardState) -> bytes:
    payload = msgpack.packb([hs.term, hs.vote, hs.commit], use_bin_type=True)
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def write_hard_state(path: Path, hs: HardState) -> None:
    atomic_write(path, encode_hard_state(hs))


def read_hard_state(path: Path) -> HardState:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return HardState()  # a new replica: never voted, term 0
    except OSError as exc:
        raise HardStateError(f"{path}: cannot read the Raft hard state ({exc})") from exc
    try:
        length, crc = _HEADER.unpack_from(raw)
        payload = raw[_HEADER.size:]
        if len(payload) != length or zlib.crc32(payload) != crc:
            raise ValueError("bad length or checksum")
        term, vote, commit = msgpack.unpackb(payload, raw=False)
        if not (isinstance(term, int) and isinstance(commit, int)
                and (vote is None or isinstance(vote, str))):
            raise ValueError("bad field types")
    except Exception as exc:  # any way the bytes fail to parse is the same damage
        raise HardStateError(
            f"{path}: the Raft hard state (term, vote, commit) is damaged ({exc}). Starting "
            f"without it could let this replica vote twice in one term; restore its data "
            f"directory from a backup or replace the replica") from exc
    return HardState(term, vote, commit)
