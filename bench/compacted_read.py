"""Read speed and size of compacted output: ours against the real broker's compaction of the same input.

Input: fixture E_compaction_exact (../shared/fixtures): `before/` compacted by the broker is `after/`; its RO
segments up to seq 8058 are the broker's compacted output (5-message bundles, not compressed, TANK_FORMAT.md §6.3).
We compact `before/` with several bundle policies and decode every compacted segment from memory (walk + message
decode, the scan's core; files read once), alternating between the broker's output and ours in the same run.

Run: python bench/compacted_read.py [--repeat 300] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from common import machine  # noqa: E402

from tank_log.format import native  # noqa: E402
from tank_log.format.bundle import SnappyPolicy  # noqa: E402
from tank_log.format.decode import decode_messages, walk_bundles  # noqa: E402
from tank_log.maintenance.compaction import CompactionOptions, compact_partition  # noqa: E402
from tank_log.storage.datadir import scan_data_dir  # noqa: E402
from tank_log.storage.writer import BundlePolicy  # noqa: E402

FIXTURE = os.path.join(ROOT, "..", "shared", "fixtures", "E_compaction_exact")
RANGE_LAST = 8058  # the largest RO seq of before/: the broker's output up to it is the compaction of the same input
POLICIES = {
    "5 msgs, plain (whole surviving client bundles still copied)": BundlePolicy(5, 64 << 10, SnappyPolicy.NEVER),
    "20 msgs, Snappy when smaller": BundlePolicy(20, 64 << 10, SnappyPolicy.WHEN_SMALLER),
    "100 msgs, plain": BundlePolicy(100, 64 << 10, SnappyPolicy.NEVER),
    "100 msgs / 64 KiB, Snappy when smaller (default)": BundlePolicy(),
    "500 msgs / 256 KiB, Snappy when smaller": BundlePolicy(500, 256 << 10, SnappyPolicy.WHEN_SMALLER),
}


def compacted_segments(base: str) -> list[tuple[bytes, int]]:
    """(file bytes, base seq) of the RO segments holding seqs <= RANGE_LAST."""
    (part,) = scan_data_dir(base).partitions()
    return [(open(s.path, "rb").read(), s.base) for s in part.ro if (s.last or 0) <= RANGE_LAST]


def decode_rate(segments: list[tuple[bytes, int]], repeat: int) -> tuple[float, int]:
    """Messages per second decoding the segments `repeat` times (walk + decode), and the message count."""
    t0 = time.perf_counter()
    n = 0
    for _ in range(repeat):
        n = 0
        for buf, base in segments:
            res = walk_bundles(buf, 0, base)
            n += len(decode_messages(res.table))
    return n * repeat / (time.perf_counter() - t0), n


def spread(values: list[float], digits: int) -> dict:
    """Median and range over the runs."""
    return {
        "median": round(statistics.median(values), digits),
        "range": [round(min(values), digits), round(max(values), digits)],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=300)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tank-compacted-read-")
    broker = compacted_segments(os.path.join(FIXTURE, "after", "data"))
    ours: dict[str, list[tuple[bytes, int]]] = {}
    for name, policy in POLICIES.items():
        base = os.path.join(work, str(len(ours)))
        shutil.copytree(os.path.join(FIXTURE, "before", "data"), base)
        (part,) = scan_data_dir(base).partitions()
        res = compact_partition(part, CompactionOptions(force=True, broker_stopped=True, policy=policy))
        assert res.status == "compacted", res
        ours[name] = compacted_segments(base)
    shutil.rmtree(work)

    broker_bytes = sum(len(b) for b, _ in broker)
    out: dict = {"machine": machine(), "core": native.name(), "broker_bytes": broker_bytes, "policies": {}}
    rates: dict[str, list[float]] = {name: [] for name in ours}
    broker_rates: list[float] = []
    counts = {}
    for _ in range(args.runs):  # alternating: the broker's output, then each policy, in every run
        rate, counts["broker"] = decode_rate(broker, args.repeat)
        broker_rates.append(rate)
        for name, segs in ours.items():
            rate, counts[name] = decode_rate(segs, args.repeat)
            rates[name].append(rate)
    assert len(set(counts.values())) == 1, counts  # the same messages everywhere
    out["messages"] = counts["broker"]
    out["broker_msgs_per_s"] = spread(broker_rates, 0)
    for name, segs in ours.items():
        nbytes = sum(len(b) for b, _ in segs)
        out["policies"][name] = {
            "bytes": nbytes,
            "bytes_vs_broker": round(nbytes / broker_bytes, 3),
            "msgs_per_s": spread(rates[name], 0),
            "speed_vs_broker": spread([r / b for r, b in zip(rates[name], broker_rates, strict=True)], 2),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
