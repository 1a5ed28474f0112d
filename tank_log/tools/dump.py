"""`tank-log dump`: messages as JSON lines in the fixtures' dump format, or bundle headers (`--bundles`)."""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from tank_log.errors import TankFormatError
from tank_log.format import native
from tank_log.format.messages import MessageColumns
from tank_log.storage.datadir import Unread, classify_path, scan_partitions
from tank_log.storage.salvage import data_beyond_break
from tank_log.storage.segment import Segment, Tail

_PRINTABLE = bytes(range(0x20, 0x7F))

log = logging.getLogger(__name__)


def tail_loss(segment: Segment, tail: Tail | None) -> Unread | None:
    """After a whole segment was read: what its complete bundles left out. A torn tail of the active segment is an
    append in flight while the broker runs (§3.11): a warning, nothing lost. A torn tail of an RO segment, or corrupt
    bytes with data after them (in any segment), is data the read could not return."""
    if tail is None or not tail.torn_bytes:
        return None
    beyond = data_beyond_break(segment, tail)
    if beyond is not None:
        reason = f"corrupt bytes inside the file, data follows ({beyond}); the rest of the file is not read"
        return Unread(segment.path, reason, tail.valid_end, tail.torn_bytes)
    if not segment.is_active:
        reason = "torn tail after the last complete bundle of an RO segment: data lost at the end"
        return Unread(segment.path, reason, tail.valid_end, tail.torn_bytes)
    log.warning(
        "%s @%d: torn tail of %d bytes after the last complete bundle (an append in flight if the broker runs)",
        segment.path,
        tail.valid_end,
        tail.torn_bytes,
    )
    return None


def message_lines(segment: Segment, topic: str | None, partition: int | None, unread: list[Unread]) -> Iterator[str]:
    """The JSON lines of a segment's messages, a decoded chunk at a time (each block ends with a newline); what the
    read could not return is appended to `unread`."""
    prefix = json.dumps({"topic": topic, "partition": partition}, separators=(",", ":"))[:-1] + ',"seq":'
    walk = segment.chunks()
    for chunk in walk:
        if len(chunk.cols):
            yield json_lines(prefix, chunk.cols)
    _note(unread, tail_loss(segment, walk.tail))


def _note(unread: list[Unread], loss: Unread | None) -> None:
    if loss is not None:
        log.warning("%s", loss)
        unread.append(loss)


def json_lines(prefix: str, c: MessageColumns) -> str:
    """One JSON line per message, `prefix` + seq + ts, key, value: the text `json.dumps` gives for the record dict
    (a missing key dumps as an empty one). Built in bulk by the compiled core when it is there."""
    core = native.core()
    if core is not None:
        raw = core.json_lines(prefix.encode(), c.data, c.seq, c.ts, c.key_off, c.key_len, c.val_off, c.val_len)
        return raw.decode("ascii")  # type: ignore[no-any-return]
    lines = []
    seqs, tss = c.seq.tolist(), c.ts.tolist()
    for i in range(len(c)):
        key = c.key(i) or b""
        value = c.value(i)
        lines.append(
            f'{prefix}{seqs[i]},"ts":{tss[i]},"key":{_json_text(key)},"key_b64":"{base64.b64encode(key).decode()}",'
            f'"value":{_json_text(value)},"value_b64":"{base64.b64encode(value).decode()}"}}\n'
        )
    return "".join(lines)


def _json_text(raw: bytes) -> str:
    """A JSON string only when every byte is printable ASCII (0x20..0x7e), as in the fixtures' dumps; else null."""
    return json.dumps(raw.decode("ascii")) if not raw.translate(None, _PRINTABLE) else "null"


def bundle_records(segment: Segment, unread: list[Unread]) -> Iterator[dict[str, Any]]:
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
    _note(unread, tail_loss(segment, walk.tail))


def _segment_location(path: str) -> tuple[str | None, int | None]:
    part_dir = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(part_dir)
    if name.isdigit():
        return os.path.basename(os.path.dirname(part_dir)), int(name)
    return None, None


def dump_path(
    path: str | os.PathLike[str],
    *,
    bundles: bool = False,
    topics: list[str] | None = None,
    unread: list[Unread] | None = None,
) -> Iterator[str]:
    """JSON lines for a segment file, partition, topic or base path (sequence order per partition), in blocks of
    whole lines, each ending with a newline.

    What could not be returned is appended to `unread`, each with its file and byte offset: partition directories and
    segment files the broker never reads, torn tails of RO segments, corrupt bytes (the rest of that segment is
    skipped; the next segment is read). Without `unread`, the first such loss raises.

    Raises:
        TankFormatError: data could not be read, and no `unread` list was given.
    """
    path = os.fspath(path)
    losses: list[Unread] = [] if unread is None else unread
    if classify_path(path) == "segment":
        targets = [(Segment(path), *_segment_location(path))]
    else:
        parts, left_out = scan_partitions(path, topics)
        for u in left_out:
            _note(losses, u)
        targets = [(s, p.topic, p.id) for p in parts for s in p.segments]
    for seg, topic, partition in targets:
        _raise_first(losses, strict=unread is None)
        try:
            if bundles:
                for rec in bundle_records(seg, losses):
                    yield json.dumps(rec, separators=(",", ":")) + "\n"
            else:
                yield from message_lines(seg, topic, partition, losses)
        except TankFormatError as err:
            offset = err.offset or 0
            _note(losses, Unread(err.path or seg.path, err.message, offset, max(seg.size - offset, 0)))
    _raise_first(losses, strict=unread is None)


def _raise_first(losses: list[Unread], *, strict: bool) -> None:
    if strict and losses:
        first = losses[0]
        raise TankFormatError(first.reason, first.path, first.offset)
