"""`.cleanup.log` in the base path (docs/FORMAT.md §1.6): per compacted partition, the highest seq covered by its
last compaction. Binary records `topic_len:u8 topic partition:u16 seq:u64`, no header; last record wins.

This module is the byte format only; reading and rewriting the file is `storage/cleanup_marks.py`."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from tank_log.errors import CleanupLogError

FILE_NAME = ".cleanup.log"
_TAIL = struct.Struct("<HQ")


@dataclass(frozen=True)
class CleanupRecord:
    topic: str
    partition: int
    seq: int


def parse_cleanup_log(data: bytes, path: str | None = None) -> list[CleanupRecord]:
    """Decode every record, in file order; a truncated record raises CleanupLogError (the broker would read past
    its mapping).

    Raises:
        CleanupLogError: a truncated or malformed record (with its byte offset).
    """
    out = []
    pos = 0
    while pos < len(data):
        tlen = data[pos]
        if pos + 1 + tlen + _TAIL.size > len(data):
            raise CleanupLogError("truncated record", path, pos)
        topic = data[pos + 1 : pos + 1 + tlen].decode("utf-8", errors="surrogateescape")
        partition, seq = _TAIL.unpack_from(data, pos + 1 + tlen)
        out.append(CleanupRecord(topic, partition, seq))
        pos += 1 + tlen + _TAIL.size
    return out


def encode_cleanup_log(records: Iterable[CleanupRecord]) -> bytes:
    """Raises:
    ValueError: a topic name over 255 bytes, a partition over u16 or a seq over u64.
    """
    out = bytearray()
    for r in records:
        topic = r.topic.encode("utf-8", errors="surrogateescape")
        if not 0 < len(topic) <= 255 or not 0 <= r.partition < 0xFFFF or not 0 <= r.seq < 1 << 64:
            raise ValueError(f"cannot encode {r}")
        out.append(len(topic))
        out += topic
        out += _TAIL.pack(r.partition, r.seq)
    return bytes(out)
