"""The import's checks before it writes (`import_delta.checked_keys`) hold a row group's keys at a time, not the
table's: their memory does not grow with the table."""

import json
import os
import subprocess
import sys
import types

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import write_deltalake

from tank_log.errors import JobConfigError
from tank_log.lakehouse.location import locate
from tank_spark.import_delta import checked_keys

FILES = 16
ROWS = 100_000  # per file: 1.6 M rows, 16 partitions of 4 topics, each file a seq range above the previous one's

CHILD = """
import json, sys, types
import pyarrow as pa
from tank_log.lakehouse.location import locate
from tank_spark.import_delta import checked_keys
location = locate(sys.argv[1])
keys = checked_keys(types.SimpleNamespace(topics=None), location, location.open())
print(json.dumps({"peak": pa.default_memory_pool().max_memory(), "keys": [[*k, *v] for k, v in keys.items()]}))
"""


def _table(path):
    schema = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("seq", pa.int64()),
                        ("ts", pa.timestamp("us", "UTC")), ("key", pa.binary()), ("value", pa.binary())])  # fmt: skip
    per = ROWS // 16
    for f in range(FILES):
        seq = np.arange(f * per + 1, (f + 1) * per + 1, dtype=np.int64)
        batches = [
            pa.record_batch(
                [
                    pa.array([f"topic{t}"] * per),
                    pa.array(np.full(per, p, dtype=np.int32)),
                    pa.array(seq),
                    pa.array(np.full(per, 1_800_000_000_000_000, dtype=np.int64)).cast(schema.field("ts").type),
                    pa.nulls(per, pa.binary()),
                    pa.array([b"v"] * per, pa.binary()),
                ],
                schema=schema,
            )
            for t in range(4)
            for p in range(4)
        ]
        write_deltalake(str(path), pa.Table.from_batches(batches, schema), mode="append")
    return str(path)


@pytest.mark.slow
def test_the_checks_before_the_import_hold_a_row_group_of_keys_not_the_table(tmp_path):
    """Arrow's high-water mark in a fresh process checking a table of 16 files (1.6 M rows) stays below half the
    table's key columns: the checks used to read the whole table's topic, partition and seq into one table and group
    it (180 MB here, 5 times the key columns; now 8 MB). The per-partition summary is the table's."""
    table = _table(tmp_path / "table")
    files = [os.path.join(table, f) for f in sorted(os.listdir(table)) if f.endswith(".parquet")]
    assert len(files) == FILES
    keys = ds.dataset(files, format="parquet").to_table(columns=["topic", "partition", "seq"])
    r = subprocess.run([sys.executable, "-c", CHILD, table], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    per = ROWS // 16
    assert sorted(map(tuple, out["keys"])) == [
        (f"topic{t}", p, FILES * per, 1, FILES * per) for t in range(4) for p in range(4)
    ]
    assert out["peak"] < keys.nbytes / 2, (out["peak"], keys.nbytes)


def _check(path, *files):
    """`checked_keys` of a table written as `files`, each a list of (topic, partition, seq) in one append."""
    for rows in files:
        write_deltalake(
            str(path),
            pa.table(
                {
                    "topic": pa.array([t for t, _, _ in rows], pa.string()),
                    "partition": pa.array([p for _, p, _ in rows], pa.int32()),
                    "seq": pa.array([s for _, _, s in rows], pa.int64()),
                    "ts": pa.array([1_800_000_000_000_000] * len(rows), pa.int64()).cast(pa.timestamp("us", "UTC")),
                    "key": pa.nulls(len(rows), pa.binary()),
                    "value": pa.array([b"v"] * len(rows), pa.binary()),
                }
            ),
            mode="append",
        )
    location = locate(str(path))
    return checked_keys(types.SimpleNamespace(topics=None), location, location.open())


def test_a_seq_in_two_files_is_refused_and_files_out_of_order_are_not(tmp_path):
    """Row groups are checked one at a time: a seq that two files of a partition hold is still found (their seq ranges
    overlap, so the partition is read again alone), naming the seq; files in any order, or interleaving without a
    seq in common, pass with the table's counts and ranges."""
    with pytest.raises(JobConfigError, match=r"column seq: 3 appears more than once in topic 't' partition 0 "):
        _check(tmp_path / "a", [("t", 0, 1), ("t", 0, 3), ("u", 0, 9)], [("u", 0, 10), ("t", 0, 3), ("t", 0, 4)])
    keys = _check(tmp_path / "b", [("t", 0, 4), ("t", 0, 6)], [("t", 0, 1), ("t", 0, 3)], [("t", 0, 2), ("t", 1, 2)])
    assert keys == {("t", 0): (5, 1, 6), ("t", 1): (1, 2, 2)}
