"""Typed values: a topic's keys or values (Avro, Protobuf, JSON with a JSON Schema, or raw bytes / UTF-8 / JSON)
decoded into Arrow columns, batch by batch, with the bad ones named (never raised), and the schema changes a table
may follow (`evolve`).

    decoder = decoder_for(ValueSpec("avro", schema_file="orders.avsc"))
    decoded = decoder.decode(values)          # a pa.BinaryArray → Decoded(columns, bad, errors, schema_ids)
"""

from __future__ import annotations

from tank_log.values.evolve import evolve
from tank_log.values.factory import decoder_for
from tank_log.values.spec import Decoded, ValueDecoder, ValueFormatName, ValueSpec

__all__ = ["Decoded", "ValueDecoder", "ValueFormatName", "ValueSpec", "decoder_for", "evolve"]
