"""Decoded message columns ↔ Arrow, without a Python object per message.

`walked_batch` reads the bundles of a headers-only walk into a batch: the compiled core in one pass per message set
(`compiled_walked_batch`), the pure-Python core through the decoded columns (`columns_batch`). `WALKED_BATCH` holds
the one in use.

Keys and values sit interleaved with message headers in the decoded buffer. The compiled core copies them into one
buffer of the exact size (`gather_spans`); the pure-Python core views the buffer as one binary array whose elements
alternate value / gap (offsets = start0, end0, start1, end1, ...; spans sorted by offset) and has Arrow `take` the
value elements (a kernel that grows its output as it goes: 0.03 s more per 1M 100-byte messages). `GATHER` holds the
one in use (`compiled_gather` or `pure_gather`, see `format.native`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeAlias

import numpy as np
import pyarrow as pa

from tank_log.format import native
from tank_log.format.decode import NATIVE_CODECS, NO_MESSAGE_LIMIT, BundleTable, decode_messages, walk_bundles
from tank_log.format.messages import MessageColumns

try:
    from tank_log.format import _codec
except ImportError:  # not built (no C compiler at install), or not for this Python: the pure-Python code runs
    native.failed("tank_log.format._codec")

MESSAGE_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.uint64(), nullable=False),
        pa.field("ts", pa.uint64(), nullable=False),  # producer timestamp, ms by convention (docs/FORMAT.md §3.7)
        pa.field("key", pa.binary()),  # null = no key
        pa.field("value", pa.binary(), nullable=False),
    ]
)


class _HidePandas:
    """A meta path finder for which pandas is not installed."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name == "pandas":
            raise ModuleNotFoundError("pandas hidden from pyarrow's detection", name=name)
        return None


@functools.cache
def skip_pandas_detection() -> bool:
    """Keep pyarrow from importing pandas for nothing (once per process; True if it applied).

    The first time pyarrow converts a Python or NumPy object (`pa.array`, `pa.scalar`, a Python scalar in a compute
    call), it checks whether that object is a pandas one and, to know, imports pandas when it is installed (its
    `_PandasAPIShim`): 0.25-0.4 s of a job's task or a CLI command (bench/RESULTS.md, "Spark's Python workers").
    That check runs here once with pandas hidden, so pyarrow records it as absent; conversions that need pandas
    (`to_pandas`, `from_pandas`) still import it when called, after which pyarrow recognises pandas objects again. A
    process that already imported pandas is left alone."""
    if "pandas" in sys.modules:
        return False
    sys.meta_path.insert(0, _HidePandas)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(_HidePandas)
    return "pandas" not in sys.modules


def _gather(data: bytes, off: np.ndarray, length: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """The binary array of the spans [off, off + length) of `data` (null where not `valid`)."""
    n = len(off)
    if n == 0:
        return pa.array([], pa.binary())
    return GATHER.impl(data, off, length, valid)


# `_gather` of n > 0 spans: data, off, length, valid -> the binary array
Gather: TypeAlias = Callable[[bytes, np.ndarray, np.ndarray, np.ndarray | None], pa.Array]


def pure_gather(data: bytes, off: np.ndarray, length: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    """The pure-Python gather: Arrow's `take` over the buffer (`_take_spans`)."""
    return _take_spans(pa.py_buffer(data), off, length, valid)


def compiled_gather(data: bytes, off: np.ndarray, length: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    """The compiled gather (`_codec.gather_spans`): one copy into a buffer of the exact size; spans it declines
    (outside `data`, or past int32 offsets) go to `_take_spans`."""
    got = _codec.gather_spans(data, np.ascontiguousarray(off), np.ascontiguousarray(length))
    if got is None:
        return _take_spans(pa.py_buffer(data), off, length, valid)
    offsets, values = got
    n = len(off)
    validity = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    nulls = 0 if valid is None else n - int(np.count_nonzero(valid))
    buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(values)]
    return pa.BinaryArray.from_buffers(pa.binary(), n, buffers, null_count=nulls)


def _take_spans(data: pa.Buffer, off: np.ndarray, length: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    """`_gather` with Arrow's `take` (the pure-Python core's way, and spans past int32 offsets)."""
    n = len(off)
    picks = np.arange(0, 2 * n, 2, dtype=np.int64)
    if n > 1 and (off[1:] < off[:-1] + length[:-1]).any():
        # spans out of buffer order (decompressed sets sit after the plain ones): sort them, pick by rank
        order = np.argsort(off, kind="stable")
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n, dtype=np.int64)
        off, length, picks = off[order], length[order], 2 * rank
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2] = off
    bounds[1::2] = off + length
    idx = pa.array(picks, mask=None if valid is None else ~valid)
    if data.size < 1 << 31:  # int32 offsets: take yields `binary` directly
        spans = pa.BinaryArray.from_buffers(pa.binary(), 2 * n - 1, [None, pa.py_buffer(bounds.astype(np.int32)), data])
        return spans.take(idx)
    spans = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 2 * n - 1, [None, pa.py_buffer(bounds), data])
    return spans.take(idx).cast(pa.binary())


def to_record_batch(cols: MessageColumns, select: np.ndarray | None = None) -> pa.RecordBatch:
    """Build a batch of MESSAGE_SCHEMA from decoded columns; `select` is an optional boolean row mask."""
    seq, ts, koff, klen, voff, vlen = cols.seq, cols.ts, cols.key_off, cols.key_len, cols.val_off, cols.val_len
    if select is not None:
        seq, ts, koff, klen, voff, vlen = (a[select] for a in (seq, ts, koff, klen, voff, vlen))
    has_key = koff >= 0
    # a missing key gets a zero-length span at its value's start, keeping the offsets monotonic
    koff = np.where(has_key, koff, voff)
    keys = _gather(cols.data, koff, klen, has_key)
    values = _gather(cols.data, voff, vlen)
    return pa.RecordBatch.from_arrays([pa.array(seq), pa.array(ts), keys, values], schema=MESSAGE_SCHEMA)


def walked_batch(table: BundleTable) -> pa.RecordBatch:
    """The messages of a headers-only walk's table (`walk_bundles(collect=False)`, or a piece of one: see
    `decode.pieces`) as one batch of MESSAGE_SCHEMA.

    Raises:
        TankFormatError: a malformed message set (buffer offset; the caller adds the file).
    """
    return WALKED_BATCH.impl(table)


def columns_batch(table: BundleTable) -> pa.RecordBatch:
    """`walked_batch` through decoded columns, as `Segment.chunks` reads: the table's bundles walked again collecting
    their message sets, decoded, then keys and values gathered; so the first error in file order is the one a
    collecting walk meets (a set that does not decompress, then the decode)."""
    if not len(table):
        return pa.RecordBatch.from_pylist([], schema=MESSAGE_SCHEMA)
    start, end = int(table.offsets[0]), int(table.ends[-1])
    walked = walk_bundles(
        table.walked, start, int(table.firsts[0]), max_bytes=end - start, max_messages=NO_MESSAGE_LIMIT
    ).table
    assert len(walked) == len(table), "a walk again over walked headers stops where they end"
    return to_record_batch(decode_messages(walked))


def compiled_walked_batch(table: BundleTable) -> pa.RecordBatch:
    """`walked_batch` in one compiled pass (`_codec.scan_sets`); a table it declines (a malformed message set, or keys
    or values past int32 offsets) goes through the columns, for the precise error or with large offsets."""
    t = table
    got = _codec.scan_sets(t.walked, t.set_offsets, t.ends, t.flags, t.counts, t.firsts, t.lasts, NATIVE_CODECS)
    if got is None:
        return columns_batch(table)
    seq, ts, key_valid, null_keys, key_offsets, key_bytes, value_offsets, value_bytes = got
    n = len(seq)
    validity = None if key_valid is None else pa.py_buffer(key_valid)
    buffers = [validity, pa.py_buffer(key_offsets), pa.py_buffer(key_bytes)]
    keys = pa.Array.from_buffers(pa.binary(), n, buffers, null_count=null_keys)
    values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(value_offsets), pa.py_buffer(value_bytes)])
    seqs = pa.Array.from_buffers(pa.uint64(), n, [None, pa.py_buffer(seq)])
    tss = pa.Array.from_buffers(pa.uint64(), n, [None, pa.py_buffer(ts)])
    return pa.RecordBatch.from_arrays([seqs, tss, keys, values], schema=MESSAGE_SCHEMA)


def columns_from_arrow(seq: np.ndarray, ts: np.ndarray, key: pa.Array, value: pa.Array) -> MessageColumns:
    """The way back (rows to write): seqs and ms timestamps (uint64) with binary keys (null = no key) and values
    (no nulls) → MessageColumns over one buffer, the keys' bytes then the values' (one copy of each)."""
    key_off, key_len, key_bytes = _spans(key)
    val_off, val_len, val_bytes = _spans(value)
    if (val_off < 0).any():
        raise ValueError("a null value")
    n = len(seq)
    return MessageColumns(
        seq,
        ts,
        key_off,
        key_len,
        val_off + len(key_bytes),
        val_len,
        np.zeros(n, np.int64),
        key_bytes + val_bytes,
    )


def _spans(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, bytes]:
    """(offsets, lengths, bytes) of a binary array's elements within `bytes`; a null's offset is -1."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not pa.types.is_large_binary(arr.type):
        arr = arr.cast(pa.large_binary())  # binary, string, views: one offset width from here on
    n = len(arr)
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64, n + 1, arr.offset * 8) if n else np.zeros(1, np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    data = data_buf.slice(start, end - start).to_pybytes() if data_buf is not None and end > start else b""
    off = offsets[:-1] - start
    if arr.null_count:
        off = np.where(arr.is_null().to_numpy(zero_copy_only=False), -1, off)
    return off, np.diff(offsets), data


GATHER: native.Choice[Gather] = native.Choice(pure_gather, lambda: compiled_gather)
WALKED_BATCH: native.Choice[Callable[[BundleTable], pa.RecordBatch]] = native.Choice(
    columns_batch, lambda: compiled_walked_batch
)
