"""`tank-log dump`: messages as JSON lines in the fixtures' dump format, or bundle headers (`--bundles`)."""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from tank_log.errors import TankFormatError
from tank_log.storage.datadir import classify_path, partitions_at
from tank_log.storage.salvage import data_beyond_break
from tank_log.storage.segment import Segment, Tail

_PRINTABLE = bytes(range(0x20, 0x7F))


def _text(raw: bytes) -> str | None:
    """Text only when every byte is printable ASCII (0x20..0x7e), as in the fixtures' dumps."""
    return raw.decode("ascii") if not raw.translate(None, _PRINTABLE) else None


log = logging.getLogger(__name__)


def check_tail(segment: Segment, tail: Tail | None) -> None:
    """After a whole segment was read: warn about a torn tail (§3.11), fail on mid-file corruption (data follows
    the break, so the messages read are not all there is).

    Raises:
        TankFormatError: mid-file corruption (file and offset of the break).
    """
    if tail is None or not tail.torn_bytes:
        return
    beyond = data_beyond_break(segment, tail)
    if beyond is not None:
        raise TankFormatError(
            f"corrupt bytes inside the file, data follows ({beyond}); output stops here", segment.path, tail.valid_end
        )
    what = "an append in flight if the broker runs" if segment.is_active else "an RO segment: data lost at the end"
    log.warning(
        "%s @%d: torn tail of %d bytes after the last complete bundle (%s)",
        segment.path,
        tail.valid_end,
        tail.torn_bytes,
        what,
    )


def message_records(segment: Segment, topic: str | None, partition: int | None) -> Iterator[dict[str, Any]]:
    walk = segment.chunks()
    for chunk in walk:
        c = chunk.cols
        seqs, tss = c.seq.tolist(), c.ts.tolist()
        for i in range(len(c)):
            key = c.key(i) or b""
            value = c.value(i)
            yield {
                "topic": topic,
                "partition": partition,
                "seq": seqs[i],
                "ts": tss[i],
                "key": _text(key),
                "key_b64": base64.b64encode(key).decode(),
                "value": _text(value),
                "value_b64": base64.b64encode(value).decode(),
            }
    check_tail(segment, walk.tail)


def bundle_records(segment: Segment) -> Iterator[dict[str, Any]]:
    walk = segment.bundles()
    for h in walk:
        yield {
            "file": os.path.basename(segment.path),
            "offset": h.offset,
            "length": h.size,
            "codec": "snappy" if h.codec else "none",
            "count": h.count,
            "varint_count": h.varint_count,
            "sparse": h.sparse,
            "first_seq": h.first_seq,
            "last_seq": h.last_seq,
        }
    check_tail(segment, walk.tail)


def _segment_location(path: str) -> tuple[str | None, int | None]:
    part_dir = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(part_dir)
    if name.isdigit():
        return os.path.basename(os.path.dirname(part_dir)), int(name)
    return None, None


def dump_path(path: str | os.PathLike[str], *, bundles: bool = False, topics: list[str] | None = None) -> Iterator[str]:
    """JSON lines for a segment file, partition, topic or base path (sequence order per partition)."""
    path = os.fspath(path)
    if classify_path(path) == "segment":
        targets = [(Segment(path), *_segment_location(path))]
    else:
        targets = [(s, p.topic, p.id) for p in partitions_at(path, topics) for s in p.segments]
    for seg, topic, partition in targets:
        records = bundle_records(seg) if bundles else message_records(seg, topic, partition)
        for rec in records:
            yield json.dumps(rec, separators=(",", ":"))
