"""`tank-log demo DIR`: a realistic broker base path written with our writer, for trying every job.

Topics:
- `orders` (3 partitions, delete policy, 7-day retention): keyed JSON orders, Snappy bundles of ~50 messages,
  several RO segments (old name timestamps, so retention has work) + an active segment;
- `profiles` (2 partitions, `log.cleanup.policy=cleanup`): user profiles with many updates per key, tombstones,
  some keyless notes and keyless empty messages — the compaction demo;
- `clicks` (1 partition): keyless 1-message plain bundles, like a chatty producer;
- with `typed`, `payments` (1 partition): keyed Avro values (`PAYMENT_SCHEMA`, written beside the topics as
  `payments.avsc`), three of them cut short by a faulty producer — the typed-table demo (docs/guides/typed-tables.md).
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


def write_demo(
    directory: str | os.PathLike[str], *, seed: int = 7, now_ms: int | None = None, typed: bool = False
) -> str:
    """Create the demo base path at `directory` (must not exist or be empty); return it. `typed`: also the
    `payments` topic of Avro values and its schema file.

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
    return directory
