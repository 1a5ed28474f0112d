"""A utf8 table's rows whose value is null: a value that is not UTF-8 (its bytes in raw_value). A filter on the
nulls finds them through our Delta dataset (whose file guarantees once claimed every row had a value within the
file's bounds, pruning the files that hold nulls), and the import restores every message byte for byte from either
format (it once refused such a table: "column value: null")."""

import os

import pyarrow.dataset as pds
import pytest

from tank_log.format.bundle import Message
from tank_log.lakehouse import TableLocation
from tank_log.storage.appender import PartitionAppender
from tank_log.storage.datadir import scan_data_dir

pytestmark = pytest.mark.spark
TS = 1_790_000_000_000
MESSAGES = [Message(1, TS, b"k", b""), Message(2, TS, None, b"\xff\x00"), Message(3, TS, b"k", b"text")]


def run(main, *argv):
    return main(["--master", "local[1]", "--in-driver-max-bytes", "1gb", *argv])


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_values_that_are_not_utf8_come_back(tmp_path, fmt):
    from tank_spark.export.job import main as export
    from tank_spark.import_delta import main as restore

    base, uri, restored = str(tmp_path / "base"), str(tmp_path / "table"), str(tmp_path / "restored")
    os.makedirs(os.path.join(base, "ev", "0"))
    PartitionAppender(os.path.join(base, "ev", "0")).append(MESSAGES)
    assert run(export, "--data-dir", base, "--table", uri, "--format", fmt, "--value-format", "utf8") == 0
    dataset = TableLocation.of(uri, fmt=fmt).existing().to_pyarrow_dataset()
    nulls = dataset.to_table(filter=pds.field("value").is_null(), columns=["seq", "raw_value"]).to_pylist()
    assert nulls == [{"seq": 2, "raw_value": b"\xff\x00"}]
    assert dataset.count_rows(filter=pds.field("value").is_null()) == 1
    assert dataset.count_rows(filter=pds.field("key").is_null()) == 1

    assert run(restore, "--data-dir", restored, "--table", uri, "--format", fmt) == 0
    (part,) = scan_data_dir(restored).partitions()
    got = [(m.seq, m.key or None, m.value) for s in part.segments for m in s.messages()]
    assert got == [(m.seq, m.key, m.value) for m in MESSAGES]
