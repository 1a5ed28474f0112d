"""Scan throughput into Arrow (issue: tank_log library acceptance).

Writes >= 1M generated messages (BENCH.md generator) per configuration — plain / Snappy, 1-message / 100-message
bundles — then scans every segment into `pyarrow.RecordBatch`es. Also measures the raw Snappy decompression of the
same compressed message sets (the ceiling for the Snappy cases) after every round of scans, so that each round has
its own reference. Each configuration is scanned on both codec cores
(compiled and pure Python), alternating, in the same run.

The scans run with the allocator setting the export's readers make (jobs/allocator.py); `--glibc-default-allocator`
leaves glibc's default, to measure what the setting saves.

Run: python bench/scan.py [--messages 1000000] [--workdir DIR] [--runs 3] [--only LABEL] [--glibc-default-allocator]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cramjam  # noqa: E402
from common import Timer, bundle_messages, load_average, machine  # noqa: E402

from tank_log.format import native  # noqa: E402
from tank_log.format.bundle import Message, SnappyPolicy  # noqa: E402
from tank_log.jobs.allocator import reuse_freed_buffers  # noqa: E402
from tank_log.storage.datadir import scan_partition  # noqa: E402
from tank_log.storage.partition_writer import write_partition  # noqa: E402
from tank_log.storage.writer import BundlePolicy  # noqa: E402


def messages(n: int):
    seq = 1
    for b in range((n + 99) // 100):
        for ts, key, value in bundle_messages(b):
            if seq > n:
                return
            yield Message(seq, ts, key, value)
            seq += 1


def scan(part_dir: str) -> tuple[int, int, float, float]:
    part = scan_partition(part_dir, "bench", 0)
    rows = 0
    nbytes = sum(s.size for s in part.segments)
    with Timer() as t:
        for s in part.segments:
            for batch in s.batches():
                rows += batch.num_rows
    return rows, nbytes, t.wall, t.cpu


def snappy_blocks(part_dir: str) -> list[bytes]:
    """The partition's compressed message sets, in memory."""
    part = scan_partition(part_dir, "bench", 0)
    blocks = []
    for s in part.segments:
        raw = open(s.path, "rb").read()
        blocks += [raw[h.set_offset : h.end] for h in s.bundles() if h.codec]
    return blocks


def snappy_pass(blocks: list[bytes]) -> tuple[float, float]:
    """Seconds (wall, CPU) to raw-decompress every block with the Snappy library (cramjam, the backend
    python-snappy uses), one call per set."""
    decompress = cramjam.snappy.decompress_raw
    with Timer() as t:
        for b in blocks:
            decompress(b)
    return t.wall, t.cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--workdir")
    ap.add_argument("--runs", type=int, default=3, help="scans per core (best is reported)")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--only", help="only the configurations whose label contains this (e.g. '100-msg bundles, Snappy')")
    ap.add_argument("--glibc-default-allocator", action="store_true", help="without the readers' allocator setting")
    args = ap.parse_args()
    if not args.glibc_default_allocator:
        reuse_freed_buffers()
    work = args.workdir or tempfile.mkdtemp(prefix="tank-scan-")
    results = []
    configs = [
        ("100-msg bundles, Snappy", 100, SnappyPolicy.ALWAYS),
        ("100-msg bundles, plain", 100, SnappyPolicy.NEVER),
        ("1-msg bundles, plain", 1, SnappyPolicy.NEVER),
        ("1-msg bundles, Snappy", 1, SnappyPolicy.ALWAYS),
    ]
    for label, per_bundle, snap in configs:
        if args.only and args.only not in label:
            continue
        d = os.path.join(work, label.replace(" ", "_").replace(",", ""))
        shutil.rmtree(d, ignore_errors=True)
        with Timer() as tw:
            write_partition(
                d,
                messages(args.messages),
                segment_bytes=64 << 20,
                policy=BundlePolicy(max_messages=per_bundle, max_bytes=1 << 30, snappy=snap),
            )
        scan(d)  # warm the page cache
        runs: dict[str, list[tuple[int, int, float, float]]] = {"native": [], "pure": []}
        blocks = snappy_blocks(d) if snap is SnappyPolicy.ALWAYS else []
        raw_passes: list[tuple[float, float]] = []
        for _ in range(args.runs):  # alternate the cores and the raw pass: the machine's noise hits all alike
            for core in runs:
                with native.use_pure(core == "pure"):
                    runs[core].append(scan(d))
            if blocks:
                raw_passes.append(snappy_pass(blocks))
        res: dict = {"config": label, "write_s": round(tw.wall, 1), "load_average": load_average()}
        secs = cpu_secs = 0.0
        if blocks:
            secs, cpu_secs = min(r[0] for r in raw_passes), min(r[1] for r in raw_passes)
            res["snappy_decompress_only_s"] = round(secs, 3)
            res["snappy_decompress_only_cpu_s"] = round(cpu_secs, 3)
            res["snappy_blocks"] = len(blocks)
        for core, core_runs in runs.items():
            rows, nbytes, wall, cpu = min(core_runs, key=lambda r: r[2])
            res["messages"], res["bytes_on_disk"] = rows, nbytes
            res[core] = {
                "scan_wall_s": round(wall, 3),
                "scan_wall_range_s": [round(min(r[2] for r in core_runs), 3), round(max(r[2] for r in core_runs), 3)],
                "scan_cpu_s": round(cpu, 3),
                "msgs_per_s": round(rows / wall),
                "mb_per_s": round(nbytes / wall / 1e6, 1),
                "scan_over_decompress": round(wall / secs, 2) if secs else None,
                "scan_over_decompress_cpu": round(cpu / cpu_secs, 2) if cpu_secs else None,
            }
            if blocks:  # each round's scan over the same round's raw pass, CPU: [lowest, median, highest]
                per_round = sorted(r[3] / p[1] for r, p in zip(core_runs, raw_passes, strict=True))
                res[core]["round_ratios_cpu"] = [round(per_round[i], 2) for i in (0, len(per_round) // 2, -1)]
        results.append(res)
        print(json.dumps(res), flush=True)
        shutil.rmtree(d, ignore_errors=True)
    print(f"machine: {machine()}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine(), "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
