"""The rows Spark sees, declared once: the library's message columns (`tank_log.format.arrow.MESSAGE_SCHEMA`) with
the topic and partition in front and Spark-friendly types (seq as long, ts as a UTC timestamp). The data source, the
range reader and the Delta export all derive their schemas from here."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema

from tank_log.format.arrow import MESSAGE_SCHEMA

# message column → its type in Spark rows (u64 seq fits long; ts ms → µs timestamp, TANK_FORMAT.md §3.7)
_SPARK_TYPES = {"seq": pa.int64(), "ts": pa.timestamp("us", tz="UTC")}

ROW_SCHEMA = pa.schema(
    [pa.field("topic", pa.string()), pa.field("partition", pa.int32())]
    + [pa.field(f.name, _SPARK_TYPES.get(f.name, f.type)) for f in MESSAGE_SCHEMA]
)
ROW_STRUCT = from_arrow_schema(ROW_SCHEMA)
KEY_COLUMNS = [f.name for f in ROW_SCHEMA if f.name != "value"]  # every row column but the value
