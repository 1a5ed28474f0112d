"""Decode throughput of the value codecs (tank_log.values), per format, on small messages.

Each format decodes the same logical records (a click: user id, page, milliseconds) in the Confluent wire format
(magic byte, schema id; for Protobuf the message indexes), in batches as the export hands them over, into Arrow
columns; printed as messages/s and µs/message. `binary` and `utf8` are the floor (the batch loop alone).
`avro` runs the decoder as it is picked (the compiled path when the compiled core is built), `avro-fastavro` the
same values on fastavro's path (the pure-Python core's), in the same run; `protobuf` and `protobuf-upb` likewise (the
compiled path, protobuf's parser).

Run: python bench/values.py [--messages 1000000] [--batch 65536] [--only avro,protobuf,protobuf-upb]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fastavro  # noqa: E402
import pyarrow as pa  # noqa: E402
from common import load_average, machine  # noqa: E402

from tank_log.format import native  # noqa: E402
from tank_log.values import ValueSpec, decoder_for  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data", "values")
AVSC = os.path.join(DATA, "small.avsc")
DESC = os.path.join(DATA, "shop.desc")
JSON_SCHEMA = {
    "type": "object",
    "required": ["user", "page", "ms"],
    "properties": {"user": {"type": "integer"}, "page": {"type": "string"}, "ms": {"type": "integer"}},
}
FORMATS = ("binary", "utf8", "avro", "avro-fastavro", "protobuf", "protobuf-upb", "json")
PYTHON_PATHS = ("avro-fastavro", "protobuf-upb")  # the same values as the format before them, on the Python path


def _record(i: int) -> dict[str, object]:
    return {"user": i * 7919 % 1_000_003, "page": f"/products/{i % 997}", "ms": i % 5000}


def _header(schema_id: int) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big")


def values_of(fmt: str, n: int, tmp: str) -> tuple[ValueSpec, pa.BinaryArray]:
    """A spec and `n` encoded values of `fmt` (the Confluent wire format for the schema'd ones)."""
    if fmt in ("avro", "avro-fastavro"):
        with open(AVSC, encoding="utf-8") as fh:
            schema = fastavro.parse_schema(json.load(fh))
        out, head, vals = io.BytesIO(), _header(1), []
        for i in range(n):
            out.seek(0)
            out.truncate()
            fastavro.schemaless_writer(out, schema, _record(i))
            vals.append(head + out.getvalue())
        return ValueSpec("avro", schema_file=AVSC, schema_ids={1: AVSC}), pa.array(vals, pa.binary())
    if fmt in ("protobuf", "protobuf-upb"):
        spec = ValueSpec("protobuf", schema_file=DESC, message="shop.v1.Click", schema_ids={1: DESC})
        cls = decoder_for(spec)._cls  # type: ignore[attr-defined]
        head = _header(1) + b"\x02\x04"  # message indexes [2]: Click is the file's third message
        return spec, pa.array([head + cls(**_record(i)).SerializeToString() for i in range(n)], pa.binary())
    if fmt == "json":
        path = os.path.join(tmp, "click.schema.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(JSON_SCHEMA, fh)
        spec = ValueSpec("json", schema_file=path, schema_ids={1: path})
        return spec, pa.array([_header(1) + json.dumps(_record(i)).encode() for i in range(n)], pa.binary())
    return ValueSpec(fmt), pa.array([json.dumps(_record(i)).encode() for i in range(n)], pa.binary())  # type: ignore[arg-type]


def run(
    messages: int = 1_000_000,
    batch: int = 65_536,
    only: tuple[str, ...] = FORMATS,
    report: Callable[[str], None] = print,
) -> dict[str, dict[str, float]]:
    """Decode `messages` values of each format in batches of `batch`: {format: {msgs_per_s, us_per_msg, bad}}."""
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix=".bench-values-") as tmp:
        for fmt in only:
            spec, values = values_of(fmt, messages, tmp)
            if fmt in PYTHON_PATHS:
                with native.use_pure():
                    decoder = decoder_for(spec)
            else:
                decoder = decoder_for(spec)
            decoder.decode(values[: min(batch, 1000)])  # warm: first-call costs out of the measurement
            bad = 0
            start = time.perf_counter()
            for offset in range(0, len(values), batch):
                bad += int(decoder.decode(values[offset : offset + batch]).bad.sum())
            elapsed = time.perf_counter() - start
            results[fmt] = {"msgs_per_s": messages / elapsed, "us_per_msg": elapsed / messages * 1e6, "bad": bad}
            report(f"{fmt:13s} {messages / elapsed:>12,.0f} msgs/s {elapsed / messages * 1e6:>8.2f} µs/msg  bad={bad}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--only", default=",".join(FORMATS), help="comma-separated formats")
    args = parser.parse_args()
    print(f"{machine()}; load {load_average()}; {args.messages:,} messages, batches of {args.batch:,}")
    run(args.messages, args.batch, tuple(f for f in args.only.split(",") if f))


if __name__ == "__main__":
    main()
