"""`tank-log demo DIR`: a realistic broker base path written with our writer, for trying every job.

Topics:
- `orders` (3 partitions, delete policy, 7-day retention): keyed JSON orders, Snappy bundles of ~50 messages,
  several RO segments (old name timestamps, so retention has work) + an active segment;
- `profiles` (2 partitions, `log.cleanup.policy=cleanup`): user profiles with many updates per key, tombstones,
  some keyless notes and keyless empty messages — the compaction demo;
- `clicks` (1 partition): keyless 1-message plain bundles, like a chatty producer;
- with `typed`, `payments` (1 partition): keyed Avro values (`PAYMENT_SCHEMA`, written beside the topics as
  `payments.avsc`), three of them cut short by a faulty producer — the typed-table demo (docs/guides/typed-tables.md);
- with `typed`, `shipments` (1 partition): Protobuf values (`demo.Shipment`, its FileDescriptorSet written beside the
  topics as `shipments.desc`) keyed by their order's UTF-8 id, two of them with a key that is not UTF-8.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable

from tank_log.errors import UsageError
from tank_log.format.bundle import Message, SnappyPolicy
from tank_log.storage.partition_writer import write_partition
from tank_log.storage.writer import BundlePolicy

DAY_MS = 86_400_000


def _orders(rng: random.Random, n: int, t0: int) -> list[Message]:
    out = []
    for i in range(n):
        oid = rng.randrange(n // 3)
        body = {
            "order": oid,
            "status": rng.choice(["new", "paid", "shipped", "delivered"]),
            "amount": round(rng.random() * 500, 2),
            "items": rng.randrange(1, 9),
        }
        out.append(Message(i + 1, t0 + i * 60_000, b"order-%06d" % oid, json.dumps(body).encode()))
    return out


def _profiles(rng: random.Random, n: int, t0: int) -> list[Message]:
    out = []
    for i in range(n):
        r = rng.random()
        ts = t0 + i * 30_000
        if r < 0.03:
            out.append(Message(i + 1, ts, None, b""))  # keyless empty: dropped by compaction
        elif r < 0.08:
            out.append(Message(i + 1, ts, None, b"note: profile service restarted"))
        else:
            uid = int(rng.paretovariate(1.2)) % 400
            if rng.random() < 0.05:
                out.append(Message(i + 1, ts, b"user-%04d" % uid, b""))  # tombstone
            else:
                body = {
                    "user": uid,
                    "name": f"user {uid}",
                    "plan": rng.choice(["free", "pro", "team"]),
                    "visits": rng.randrange(1000),
                }
                out.append(Message(i + 1, ts, b"user-%04d" % uid, json.dumps(body).encode()))
    return out


def _clicks(rng: random.Random, n: int, t0: int) -> list[Message]:
    return [
        Message(i + 1, t0 + i * 1000, None, b"/page/%d?ref=%d" % (rng.randrange(50), rng.randrange(5)))
        for i in range(n)
    ]


PAYMENT_SCHEMA = {
    "type": "record",
    "name": "Payment",
    "namespace": "demo",
    "fields": [
        {"name": "payment_id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "currency", "type": {"type": "enum", "name": "Currency", "symbols": ["EUR", "USD", "NOK"]}},
        {"name": "paid_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "card", "type": ["null", {"type": "record", "name": "Card", "fields": [
            {"name": "brand", "type": "string"}, {"name": "last4", "type": "string"}]}], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}  # fmt: skip
PAYMENT_SCHEMA_FILE = "payments.avsc"  # beside the topics (a file in the base path: no broker reads it)
BAD_PAYMENTS = (100, 400, 700)  # seqs whose value a faulty producer cut short: dead letters in a typed export


def _payments(rng: random.Random, n: int, t0: int) -> list[Message]:
    import datetime as dt
    import decimal
    import io

    import fastavro

    schema = fastavro.parse_schema(PAYMENT_SCHEMA)
    out = []
    for i in range(n):
        ts = t0 + i * 20_000
        card = {"brand": rng.choice(["visa", "mastercard"]), "last4": f"{rng.randrange(10000):04d}"}
        payment_id = 10_000 + i
        record = {
            "payment_id": payment_id,
            "user": f"user-{rng.randrange(400):04d}",
            "amount": decimal.Decimal(rng.randrange(100, 50_000)) / 100,
            "currency": rng.choice(["EUR", "USD", "NOK"]),
            "paid_at": dt.datetime.fromtimestamp(ts / 1000, dt.UTC),
            "card": card if rng.random() < 0.8 else None,
            "tags": rng.sample(["web", "app", "retry", "gift"], rng.randrange(3)),
        }
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, record)
        value = buf.getvalue()
        if i + 1 in BAD_PAYMENTS:
            value = value[:3]
        out.append(Message(i + 1, ts, b"payment-%d" % payment_id, value))
    return out


SHIPMENT_DESCRIPTOR_FILE = "shipments.desc"  # beside the topics, like payments.avsc
SHIPMENT_MESSAGE = "demo.Shipment"
BAD_SHIPMENT_KEYS = (50, 250)  # seqs whose key a faulty producer wrote as Latin-1: dead letters with --key-format utf8


def _shipment_file() -> bytes:
    """`shipments.proto` as a FileDescriptorSet (as `protoc --descriptor_set_out` writes it): a Shipment message of
    an id, its order, a carrier enum, a weight, a Timestamp and repeated items."""
    from google.protobuf import descriptor_pb2  # type: ignore[import-untyped]

    f = descriptor_pb2.FileDescriptorProto(name="shipments.proto", package="demo", syntax="proto3")
    f.dependency.append("google/protobuf/timestamp.proto")
    m = f.message_type.add(name="Shipment")
    carrier = m.enum_type.add(name="Carrier")
    for number, name in enumerate(["CARRIER_UNSPECIFIED", "DHL", "UPS", "POSTEN"]):
        carrier.value.add(name=name, number=number)
    fd = descriptor_pb2.FieldDescriptorProto
    for number, (name, kind, label, type_name) in enumerate(
        [
            ("shipment_id", fd.TYPE_INT64, fd.LABEL_OPTIONAL, None),
            ("order_id", fd.TYPE_STRING, fd.LABEL_OPTIONAL, None),
            ("carrier", fd.TYPE_ENUM, fd.LABEL_OPTIONAL, ".demo.Shipment.Carrier"),
            ("weight_g", fd.TYPE_INT32, fd.LABEL_OPTIONAL, None),
            ("shipped_at", fd.TYPE_MESSAGE, fd.LABEL_OPTIONAL, ".google.protobuf.Timestamp"),
            ("items", fd.TYPE_STRING, fd.LABEL_REPEATED, None),
        ],
        start=1,
    ):
        field = m.field.add(name=name, number=number, type=kind, label=label)
        if type_name:
            field.type_name = type_name
    from google.protobuf import timestamp_pb2

    imported = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(imported)  # as --include_imports: the set names every file it needs
    out: bytes = descriptor_pb2.FileDescriptorSet(file=[imported, f]).SerializeToString()
    return out


def _shipments(rng: random.Random, n: int, t0: int) -> list[Message]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_pb2.FileDescriptorSet.FromString(_shipment_file()).file:
        pool.Add(f)
    shipment = message_factory.GetMessageClass(pool.FindMessageTypeByName(SHIPMENT_MESSAGE))
    out = []
    for i in range(n):
        ts = t0 + i * 60_000
        order = f"order-{rng.randrange(6000):05d}"
        m = shipment(
            shipment_id=70_000 + i,
            order_id=order,
            carrier=rng.randrange(1, 4),
            weight_g=rng.randrange(50, 20_000),
            items=rng.sample(["book", "lamp", "mug", "shirt", "tent"], rng.randrange(1, 4)),
        )
        m.shipped_at.FromMilliseconds(ts)
        key = order.encode() if i + 1 not in BAD_SHIPMENT_KEYS else "ordre-ø".encode("latin-1")
        out.append(Message(i + 1, ts, key, m.SerializeToString()))
    return out


def write_demo(
    directory: str | os.PathLike[str], *, seed: int = 7, now_ms: int | None = None, typed: bool = False
) -> str:
    """Create the demo base path at `directory` (must not exist or be empty); return it. `typed`: also the
    `payments` topic of Avro values, the `shipments` topic of Protobuf values, and their schema files.

    Raises:
        UsageError: `directory` exists and is not empty.
    """
    import time

    directory = os.fspath(directory)
    if os.path.exists(directory) and os.listdir(directory):
        raise UsageError(f"{directory} exists and is not empty (the demo writes a new directory)")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    rng = random.Random(seed)
    topics: dict[str, tuple[str, int, Callable[[], list[Message]], BundlePolicy]] = {
        "orders": (
            "log.segment.bytes=64kb\nlog.retention.secs=7days\n",
            3,
            lambda: _orders(rng, 6000, now_ms - 14 * DAY_MS),
            BundlePolicy(max_messages=50, snappy=SnappyPolicy.CLIENT),
        ),
        "profiles": (
            "log.segment.bytes=32kb\nlog.cleanup.policy=cleanup\n",
            2,
            lambda: _profiles(rng, 5000, now_ms - 2 * DAY_MS),
            BundlePolicy(max_messages=20, snappy=SnappyPolicy.CLIENT),
        ),
        "clicks": (
            "log.segment.bytes=16kb\n",
            1,
            lambda: _clicks(rng, 2000, now_ms - DAY_MS),
            BundlePolicy(max_messages=1, snappy=SnappyPolicy.NEVER),
        ),
    }
    if typed:
        topics["payments"] = (
            "log.segment.bytes=32kb\n",
            1,
            lambda: _payments(rng, 1000, now_ms - DAY_MS),
            BundlePolicy(max_messages=50, snappy=SnappyPolicy.CLIENT),
        )
        topics["shipments"] = (
            "log.segment.bytes=32kb\n",
            1,
            lambda: _shipments(rng, 500, now_ms - DAY_MS),
            BundlePolicy(max_messages=20, snappy=SnappyPolicy.CLIENT),
        )
    for topic, (config, nparts, gen, policy) in topics.items():
        tdir = os.path.join(directory, topic)
        os.makedirs(tdir, exist_ok=True)
        with open(os.path.join(tdir, "config"), "w") as fh:
            fh.write(config)
        seg_bytes = int(config.split("log.segment.bytes=")[1].split("kb")[0]) * 1024
        for p in range(nparts):
            write_partition(os.path.join(tdir, str(p)), gen(), segment_bytes=seg_bytes, policy=policy)
    if typed:
        with open(os.path.join(directory, PAYMENT_SCHEMA_FILE), "w") as fh:
            json.dump(PAYMENT_SCHEMA, fh, indent=1)
        with open(os.path.join(directory, SHIPMENT_DESCRIPTOR_FILE), "wb") as fb:
            fb.write(_shipment_file())
    return directory
