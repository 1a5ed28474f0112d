"""The rows Spark sees, declared once: the library's message columns (`tank_log.format.arrow.MESSAGE_SCHEMA`) with
the topic and partition in front and Spark-friendly types (seq as long, ts as a UTC timestamp). The data source, the
range reader and the Delta export all derive their schemas from here."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema

from tank_log.format.arrow import MESSAGE_SCHEMA

# message column → its type in Spark rows (u64 seq fits long; ts ms → µs timestamp, docs/FORMAT.md §3.7)
_SPARK_TYPES = {"seq": pa.int64(), "ts": pa.timestamp("us", tz="UTC")}

# The producer's ts is any u64 (§3.7: ms by convention, nothing checks it). Rows keep `ts` only when it is a time
# every consumer can hold (0 .. 9999-12-31T23:59:59.999Z: Spark, Python and Delta statistics); beyond that `ts` is
# null and `ts_raw` holds the exact u64, never a wrapped or clamped value (the export counts such rows quarantined).
MAX_TS_MS = 253_402_300_799_999
TS_RAW = pa.field("ts_raw", pa.decimal128(20, 0))  # null unless ts is out of range

ROW_SCHEMA = pa.schema(
    [pa.field("topic", pa.string()), pa.field("partition", pa.int32())]
    + [pa.field(f.name, _SPARK_TYPES.get(f.name, f.type)) for f in MESSAGE_SCHEMA]
    + [TS_RAW]
)
ROW_STRUCT = from_arrow_schema(ROW_SCHEMA)
KEY_COLUMNS = ["topic", "partition", "seq", "ts", "key"]  # the row columns before the value
