"""`tank-log dump`: messages as JSON lines in the fixtures' dump format, or bundle headers (`--bundles`)."""

from __future__ import annotations

import base64
import json
import logging
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from tank_log.errors import TankFormatError
from tank_log.format import native
from tank_log.format.codecs import Codec
from tank_log.format.messages import MessageColumns
from tank_log.storage.completeness import HoleError, SegmentAudit, audited, range_hole, segment_loss
from tank_log.storage.datadir import Unread, classify_path, scan_partitions
from tank_log.storage.segment import Segment

try:
    from tank_log.tools import _dump_lines
except ImportError:  # not built (no C compiler at install), or not for this Python: the pure-Python code runs
    native.failed("tank_log.tools._dump_lines")

_PRINTABLE = bytes(range(0x20, 0x7F))

log = logging.getLogger(__name__)


def message_chunks(
    segment: Segment, topic: str | None, partition: int | None, unread: list[Unread]
) -> Iterator[tuple[str, MessageColumns]]:
    """A segment's messages, a decoded chunk at a time, with the prefix of their JSON lines (`json_lines`); what the
    read could not return is appended to `unread`."""
    prefix = json.dumps({"topic": topic, "partition": partition}, separators=(",", ":"))[:-1] + ',"seq":'
    hole = range_hole(segment)  # before any line is out: print no seq the evidence does not trust
    if hole is not None and hole.trusted_through < segment.base:
        _note(unread, hole.unread(segment.size))
        return
    audit = SegmentAudit(segment)
    walk = segment.chunks(chunk_bytes=CHUNK_BYTES, stop_seq=None if hole is None else hole.trusted_through)
    try:
        for chunk in audited(walk, audit):
            if len(chunk.cols):
                yield prefix, chunk.cols
    except HoleError as err:  # malformed data: the rest of the segment is a hole from the last message out
        _note(unread, err.hole.unread(segment.size))
        return
    _note(unread, segment_loss(audit, walk.tail) if hole is None else hole.unread(segment.size))


Block = bytes | tuple[str, MessageColumns]  # lines ready, or a chunk whose lines `json_lines` makes
FORMAT_THREADS = 2  # chunks formatted at once, beside the decoding of the next
CHUNK_BYTES = 1 << 20  # of a segment decoded at once: short holds of the GIL, which the formatting threads wait for


def _formatted(blocks: Iterator[Block]) -> Iterator[bytes | bytearray]:
    """The lines of each block, in order. With the compiled core, whose formatting releases the GIL, a chunk is
    formatted on a second thread while this one decodes the next (across segments and partitions) and the caller
    writes the last: a dump takes about as long as its formatting alone (bench/RESULTS.md, "tank-log dump")."""
    if not LINES.impl.releases_gil:
        for block in blocks:
            yield block if isinstance(block, bytes) else json_lines(*block)
        return
    with ThreadPoolExecutor(FORMAT_THREADS, thread_name_prefix="dump-format") as pool:
        pending: deque[Future[bytes | bytearray] | bytes] = deque()
        buffers = [bytearray() for _ in range(FORMAT_THREADS + 1)]  # formatting, and the one the caller writes
        for i, block in enumerate(blocks):
            if isinstance(block, bytes):
                pending.append(block)
            else:
                pending.append(pool.submit(json_lines, *block, buffers[i % len(buffers)]))
            if len(pending) > FORMAT_THREADS:
                yield _result(pending.popleft())
        while pending:
            yield _result(pending.popleft())


def _result(done: Future[bytes | bytearray] | bytes) -> bytes | bytearray:
    return done if isinstance(done, bytes) else done.result()


def _note(unread: list[Unread], loss: Unread | None) -> None:
    if loss is not None:
        log.warning("%s", loss)
        unread.append(loss)


def json_lines(prefix: str, c: MessageColumns, out: bytearray | None = None) -> bytes | bytearray:
    """One JSON line per message, `prefix` + seq + ts, key, value: the text `json.dumps` gives for the record dict
    (a missing key dumps as an empty one), in ASCII. Built in bulk by the compiled core when it is there, into `out`
    when given (a buffer reused keeps its memory: no page faults for every chunk's lines)."""
    return LINES.impl.json_lines(prefix, c, out)


def _json_lines_pure(prefix: str, c: MessageColumns) -> bytes:
    lines = []
    seqs, tss = c.seq.tolist(), c.ts.tolist()
    for i in range(len(c)):
        key = c.key(i) or b""
        value = c.value(i)
        lines.append(
            f'{prefix}{seqs[i]},"ts":{tss[i]},"key":{_json_text(key)},"key_b64":"{base64.b64encode(key).decode()}",'
            f'"value":{_json_text(value)},"value_b64":"{base64.b64encode(value).decode()}"}}\n'
        )
    return "".join(lines).encode("ascii")


def _json_text(raw: bytes) -> str:
    """A JSON string only when every byte is printable ASCII (0x20..0x7e), as in the fixtures' dumps; else null."""
    return json.dumps(raw.decode("ascii")) if not raw.translate(None, _PRINTABLE) else "null"


class Lines(Protocol):
    """`json_lines`, compiled or pure Python: the same text."""

    releases_gil: bool  # whether other threads run while it formats (then `_formatted` formats on threads)

    def json_lines(self, prefix: str, c: MessageColumns, out: bytearray | None) -> bytes | bytearray: ...


class PureLines:
    """The pure-Python JSON lines: one f-string per message."""

    releases_gil = False

    def json_lines(self, prefix: str, c: MessageColumns, out: bytearray | None) -> bytes | bytearray:
        return _json_lines_pure(prefix, c)


class CompiledLines:
    """The compiled JSON lines (`_dump_lines.pyx`), written in bulk into `out` without the GIL."""

    releases_gil = True

    def json_lines(self, prefix: str, c: MessageColumns, out: bytearray | None) -> bytes | bytearray:
        return _dump_lines.json_lines(
            prefix.encode(), c.data, c.seq, c.ts, c.key_off, c.key_len, c.val_off, c.val_len, out
        )


LINES: native.Choice[Lines] = native.Choice(PureLines(), CompiledLines)


def bundle_records(segment: Segment, unread: list[Unread]) -> Iterator[dict[str, Any]]:
    audit = SegmentAudit(segment)
    walk = segment.tables()
    try:
        for file_offset, table in walk:
            audit.observe(file_offset, table)
            for h in table.headers(file_offset):
                yield {
                    "file": os.path.basename(segment.path),
                    "offset": h.offset,
                    "length": h.size,
                    "codec": Codec(h.codec).name.lower(),  # none, snappy: the codec's name in `format/codecs/`
                    "count": h.count,
                    "varint_count": h.varint_count,
                    "sparse": h.sparse,
                    "first_seq": h.first_seq,
                    "last_seq": h.last_seq,
                }
    except TankFormatError as err:  # the rest of the segment: a hole from the last bundle out
        _note(unread, audit.failed(err).unread(segment.size))
        return
    _note(unread, segment_loss(audit, walk.tail))


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
) -> Iterator[bytes | bytearray]:
    """JSON lines (ASCII) for a segment file, partition, topic or base path (sequence order per partition), in
    blocks of whole lines, each ending with a newline.

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
        targets = [(s, p.topic, p.id) for p in parts for s in p.readable]  # none of an overlap
    yield from _formatted(_blocks(targets, bundles, losses, strict=unread is None))


def _blocks(
    targets: list[tuple[Segment, str | None, int | None]], bundles: bool, losses: list[Unread], *, strict: bool
) -> Iterator[Block]:
    for seg, topic, partition in targets:
        _raise_first(losses, strict=strict)
        try:
            if bundles:
                for rec in bundle_records(seg, losses):
                    yield (json.dumps(rec, separators=(",", ":")) + "\n").encode()
            else:
                yield from message_chunks(seg, topic, partition, losses)
        except TankFormatError as err:
            offset = err.offset or 0
            _note(losses, Unread(err.path or seg.path, err.message, offset, max(seg.size - offset, 0)))
    _raise_first(losses, strict=strict)


def _raise_first(losses: list[Unread], *, strict: bool) -> None:
    if strict and losses:
        first = losses[0]
        raise TankFormatError(first.reason, first.path, first.offset)
