"""What the compiled paths (Avro's `_avro_fast`, Protobuf's `_protobuf_fast`) share around their walk: a batch's values
as spans of one buffer, their Confluent headers read in bulk (`spans`), and the batch put together again with the
values the Python path decoded one by one in their places (`merge`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tank_log.values.spec import HEADER, MAGIC, Decoded


@dataclass
class Spans:
    """A batch's values in their buffer: value i is data[starts[i]:ends[i]], after its header when it has one."""

    data: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    present: np.ndarray  # not null
    ids: np.ndarray  # the Confluent schema id (int32; 0 without a header)
    has_id: np.ndarray  # a Confluent header: at least 5 bytes, magic byte 0


def spans(values: pa.BinaryArray | pa.LargeBinaryArray, framed: bool) -> Spans:
    """The values' spans; with `framed`, each value's header read and stepped over (the others' are left as is)."""
    n = len(values)
    width = 8 if pa.types.is_large_binary(values.type) else 4
    bufs = values.buffers()
    offsets = np.frombuffer(
        bufs[1], dtype=np.int64 if width == 8 else np.int32, count=n + 1, offset=values.offset * width
    )
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1].astype(np.int64)
    ends = offsets[1:].astype(np.int64)
    present = np.ones(n, bool) if values.null_count == 0 else ~values.is_null().to_numpy(zero_copy_only=False)
    ids = np.zeros(n, np.int32)
    has_id = np.zeros(n, bool)
    if framed:
        has_id = present & (ends - starts >= HEADER)
        has_id[has_id] = data[starts[has_id]] == MAGIC
        at = starts[has_id]
        raw = (data[at + 1].astype(np.uint32) << 24) | (data[at + 2].astype(np.uint32) << 16)
        ids[has_id] = (raw | (data[at + 3].astype(np.uint32) << 8) | data[at + 4]).view(np.int32)
        starts[has_id] += HEADER
    return Spans(data, starts, ends, present, ids, has_id)


def merge(
    values: pa.BinaryArray | pa.LargeBinaryArray,
    columns: pa.StructArray,
    bad: np.ndarray,
    errors: dict[int, str],
    slow: np.ndarray,
    found: Spans,
    decode_slow: Callable[[pa.BinaryArray | pa.LargeBinaryArray], Decoded],
) -> Decoded:
    """The batch: the compiled path's columns (`bad`, `errors` by row), the rows in `slow` (their indexes) decoded
    by `decode_slow`, value by value, in their places."""
    n = len(values)
    if len(slow):
        aside = decode_slow(values.take(pa.array(slow)))
        order = np.arange(n, dtype=np.int64)
        order[slow] = n + np.arange(len(slow))
        columns = pa.concat_arrays([columns, aside.columns]).take(pa.array(order))
        bad[slow] = aside.bad
        for i, message in zip(slow.tolist(), aside.errors.to_pylist(), strict=True):
            if message is not None:
                errors[i] = message
    if errors:
        where = np.full(n, -1, dtype=np.int64)
        rows = list(errors)
        where[rows] = np.arange(len(rows))
        texts = pa.array([errors[i] for i in rows], pa.string())
        error_column = texts.take(pa.array(where, mask=where < 0))
    else:
        error_column = pa.nulls(n, pa.string())
    return Decoded(
        columns=columns,
        bad=bad,
        errors=error_column,
        schema_ids=pa.array(found.ids, type=pa.int32(), mask=~found.has_id),
    )
