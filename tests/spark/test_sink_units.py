"""The `tank` data source writer's row reading (sink.py): Spark's Arrow batches → per-partition message columns,
without Spark (the writer itself runs end to end in test_job_import.py)."""

from decimal import Decimal

import pyarrow as pa
import pytest

from tank_log.errors import ImportRefused
from tank_log.format.bundle import Message, messages_of
from tank_spark.schema import ROW_SCHEMA
from tank_spark.sink import _partition_chunks


def batch(rows) -> pa.RecordBatch:
    names = ROW_SCHEMA.names
    return pa.RecordBatch.from_pylist([dict(zip(names, r, strict=True)) for r in rows], schema=ROW_SCHEMA)


US = 1_000


def test_runs_of_partitions_with_exact_timestamps():
    rows = [
        ("a", 0, 1, 1_700_000_000_123 * US, b"k", b"v1", None),
        ("a", 0, 3, 1_700_000_000_456 * US + 999, None, b"", None),  # µs below the ms: dropped, as the reader made it
        ("a", 1, 1, None, b"", b"v3", Decimal(2**64 - 1)),  # ts beyond what a timestamp holds: ts_raw is exact
        ("b", 1, 7, 0, None, b"v4" * 300, None),
    ]
    first, second = batch(rows[:3]), batch(rows[3:])
    got = [(tp, messages_of(cols)) for tp, cols in _partition_chunks(iter([first, batch([]), second]))]
    assert got == [
        (("a", 0), [Message(1, 1_700_000_000_123, b"k", b"v1"), Message(3, 1_700_000_000_456, None, b"")]),
        (("a", 1), [Message(1, 2**64 - 1, b"", b"v3")]),
        (("b", 1), [Message(7, 0, None, b"v4" * 300)]),
    ]


@pytest.mark.parametrize(
    "row",
    [
        ("a", 0, 1, 5, b"k", None, None),  # null value
        ("a", 0, None, 5, b"k", b"v", None),  # null seq
        ("a", 0, 0, 5, b"k", b"v", None),  # seq 0 (§3.6: seqs start at 1)
        ("a", 0, 1, None, b"k", b"v", None),  # no ts at all
        ("a", 0, 1, -1, b"k", b"v", None),  # before 1970
        (None, 0, 1, 5, b"k", b"v", None),  # no topic
    ],
)
def test_rows_the_writer_cannot_store_are_refused(row):
    good = ("a", 0, 1, 5, None, b"fine", None)
    with pytest.raises(ImportRefused, match="null seq, ts or value, a seq below 1"):
        list(_partition_chunks(iter([batch([good, row])])))
