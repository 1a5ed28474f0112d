"""Compaction at any key count: one partition whose distinct keys do or do not fit the key budget.

Generates one partition of MESSAGES keyed messages (keys uniform over KEYS: `user:%07d`, 12 bytes, or `user:%08d`
from 10,000,000 keys on; 4,000,000 over 2,000,000 gives ~1,729,500 distinct keys, 40,000,000 over 25,000,000 about
20 M), 100-byte JSON-like values, in 100-message Snappy client bundles and ~64 MiB RO segments, plus a small active
segment. Then compacts it in fresh processes (the library, as `tank-log compact --force` runs it in its worker),
alternating the budgets, `--runs` times each:

- a budget that holds every key (the in-memory reference, measured in the same run),
- the default budget (256mb), and a small one (8mb): past the budget the keys spill to disk.

Reports wall time, peak RSS (VmHWM of the compacting process), the key state and its bytes per distinct key, the
spill, the ratio to the in-memory reference, and checks that every run leaves the same files byte for byte.

Run: python bench/compact_keys.py [--messages 4000000 --keys 2000000] [--budgets 1gb,256mb,8mb] [--runs 3]
     python bench/compact_keys.py --messages 40000000 --keys 25000000 --budgets 1gb,256mb   (~20 M distinct keys)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from common import WORDS, machine  # noqa: E402

from tank_log.format.broker_config import parse_size  # noqa: E402
from tank_log.format.bundle import SnappyPolicy  # noqa: E402
from tank_log.format.messages import MessageColumns  # noqa: E402
from tank_log.storage.partition_writer import PartitionWriter  # noqa: E402
from tank_log.storage.writer import BundlePolicy, SegmentWriter  # noqa: E402

CLIENT = BundlePolicy(max_messages=100, max_bytes=1 << 30, snappy=SnappyPolicy.CLIENT)
VALUE_BYTES, TS0 = 100, 1_776_000_000_000
BATCH = 200_000


def _values(rng: np.random.Generator, n: int) -> np.ndarray:
    """n JSON-like 100-byte values (an id, an amount, words): compressible as BENCH.md's are."""
    pool = []
    for i in range(4096):
        words = " ".join(WORDS[int(w)] for w in rng.integers(len(WORDS), size=12))
        pool.append(f'{{"i":{i:08d},"amount":{rng.random() * 1e4:.2f},"note":"{words}'.encode()[:VALUE_BYTES])
    table = np.frombuffer(b"".join(v.ljust(VALUE_BYTES) for v in pool), np.uint8).reshape(4096, VALUE_BYTES)
    return table[rng.integers(4096, size=n)]


def generate(part_dir: str, messages: int, keys: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    writer = PartitionWriter(part_dir, segment_bytes=64 << 20, with_active=False, policy=CLIENT)
    digits = max(7, len(str(keys - 1)))
    key_bytes = 5 + digits
    width = key_bytes + VALUE_BYTES
    for first in range(0, messages, BATCH):
        n = min(BATCH, messages - first)
        k = rng.integers(keys, size=n)
        rows = np.empty((n, width), np.uint8)
        text = np.char.zfill(k.astype(f"U{digits}"), digits).astype(f"S{digits}").view(np.uint8).reshape(n, digits)
        rows[:, :5] = np.frombuffer(b"user:", np.uint8)
        rows[:, 5:key_bytes] = text
        rows[:, key_bytes:] = _values(rng, n)
        off = np.arange(n, dtype=np.int64) * width
        seq = np.arange(first + 1, first + n + 1, dtype=np.uint64)
        cols = MessageColumns(
            seq,
            TS0 + seq,
            off,
            np.full(n, key_bytes, np.int64),
            off + key_bytes,
            np.full(n, VALUE_BYTES, np.int64),
            np.zeros(n, np.int64),
            rows.tobytes(),
        )
        if first + n < messages:
            writer.add_columns(cols)
            continue
        writer.add_columns(cols.slice(0, n - 1000))
        writer.finish()
        active = SegmentWriter(part_dir, active=True, policy=CLIENT)  # the last 1,000: not compacted
        active.add_columns(cols.slice(n - 1000, n))
        active.close()


COMPACT = """
import json, sys, time
from tank_log.jobs.allocator import reuse_freed_buffers
reuse_freed_buffers()
from tank_log.maintenance.compaction import CompactionOptions, compact_partition
from tank_log.storage.datadir import scan_data_dir
(part,) = scan_data_dir(sys.argv[1]).partitions()
t0 = time.perf_counter()
res = compact_partition(part, CompactionOptions(force=True, broker_stopped=True, key_state_budget=int(sys.argv[2])))
wall = time.perf_counter() - t0
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"result": res.to_dict(), "wall_s": wall, "peak_rss_mib": hwm / 1024}))
"""


def digest(d: str) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(d)):
        if not name.startswith("."):
            h.update(name.encode())
            with open(os.path.join(d, name), "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


def compact_copy(src: str, work: str, budget: int) -> dict:
    base = os.path.join(work, "run")
    shutil.rmtree(base, ignore_errors=True)
    shutil.copytree(src, base)
    os.sync()  # the copy's writeback does not run during the compaction
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", COMPACT, base, str(budget)], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    run = json.loads(out.stdout.strip().splitlines()[-1])
    run["digest"] = digest(os.path.join(base, "bench", "0"))
    shutil.rmtree(base)
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir")
    ap.add_argument("--messages", type=int, default=4_000_000)
    ap.add_argument("--keys", type=int, default=2_000_000, help="keys are uniform over this many")
    ap.add_argument("--budgets", default="1gb,256mb,8mb", help="the first one must hold every key (the reference)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="tank-compact-keys-")
    src = os.path.join(work, "data")
    pdir = os.path.join(src, "bench", "0")
    if not os.path.exists(pdir):
        t0 = time.perf_counter()
        generate(pdir, args.messages, args.keys, args.seed)
        with open(os.path.join(src, "bench", "config"), "w") as fh:
            fh.write("log.cleanup.policy=cleanup\n")
        print(f"generated in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    ro_bytes = sum(os.path.getsize(os.path.join(pdir, f)) for f in os.listdir(pdir) if f.endswith(".ilog"))
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    budgets = [parse_size(b) for b in args.budgets.split(",")]
    runs: dict[int, list[dict]] = {b: [] for b in budgets}
    for _ in range(args.runs):
        for b in budgets:  # alternating: the machine's noise spreads over every budget alike
            runs[b].append(compact_copy(src, work, b))
            r = runs[b][-1]
            print(f"budget {b >> 20} MiB: {r['wall_s']:.2f} s, {r['peak_rss_mib']:.0f} MiB", file=sys.stderr)
    ref = budgets[0]
    out: dict = {
        "machine": machine(),
        "load_before": load,
        "messages": args.messages,
        "ro_bytes": ro_bytes,
        "distinct_keys": runs[ref][0]["result"]["distinct_keys"],
        "same_output": len({r["digest"] for rs in runs.values() for r in rs}) == 1,
        "budgets": {},
    }
    for b, rs in runs.items():
        res = [r["result"] for r in rs]
        walls = sorted(r["wall_s"] for r in rs)
        ratios = sorted(r["wall_s"] / q["wall_s"] for r, q in zip(rs, runs[ref], strict=True))
        out["budgets"][f"{b >> 20} MiB"] = {
            "wall_s": [round(w, 2) for w in walls],
            "over_in_memory": [round(x, 2) for x in ratios],
            "peak_rss_mib": [round(r["peak_rss_mib"]) for r in rs],
            "spill_buckets": res[0]["spill_buckets"],
            "spill_mb": round(res[0]["spill_bytes"] / 1e6, 1),
            "key_state_mib": round(res[0]["key_state_bytes"] / (1 << 20), 1),
            "key_state_bytes_per_key": round(res[0]["key_state_bytes"] / res[0]["distinct_keys"], 1),
            "messages_after": res[0]["messages_after"],
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
