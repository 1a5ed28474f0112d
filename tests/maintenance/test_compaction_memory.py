"""Compaction's memory stays within `key_state_budget` at any key count: keys that need 4x the budget spill to
bucket files and compact to exactly what an unlimited run leaves, with peak RSS within the budget plus the
baseline."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from tank_log.format.bundle import Message, SnappyPolicy
from tank_log.maintenance.verify import verify_path
from tank_log.storage.datadir import scan_partition
from tank_log.storage.partition_writer import write_partition
from tank_log.storage.writer import BundlePolicy

pytestmark = pytest.mark.slow

MESSAGES = 600_000
KEYS = 300_000
BUDGET = 7 << 18  # 1.75 MiB: a quarter of what the keys take in memory
MiB = 1 << 20

# compacts one partition in a fresh interpreter and prints the result and the process's peak RSS (VmHWM: getrusage's
# ru_maxrss survives exec, so it would report pytest's own peak)
COMPACT = """
import json, sys
from tank_log.maintenance.compaction import CompactionOptions, compact_partition
from tank_log.storage.datadir import scan_data_dir
(part,) = scan_data_dir(sys.argv[1]).partitions()
options = CompactionOptions(force=True, broker_stopped=True, key_state_budget=int(sys.argv[2]))
res = compact_partition(part, options, base_path=sys.argv[1])
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"result": res.to_dict(), "peak_rss": hwm * 1024}))
"""


def write(base: str, keyed: bool) -> str:
    def messages():
        for i in range(MESSAGES):
            key = b"key-%09d" % (i * 7919 % KEYS) if keyed else None
            yield Message(i + 1, 1_700_000_000_000 + i, key, b"value-%d" % i)

    policy = BundlePolicy(max_messages=100, snappy=SnappyPolicy.NEVER)
    write_partition(os.path.join(base, "t", "0"), messages(), segment_bytes=8 << 20, policy=policy)
    return base


def compact(base: str, budget: int) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", COMPACT, base, str(budget)], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def contents(base: str) -> list[tuple]:
    part = scan_partition(os.path.join(base, "t", "0"), "t", 0)
    return [(m.seq, m.ts, m.key, m.value) for s in part.segments for m in s.messages()]


def test_keys_four_times_the_budget_spill_and_compact_within_it(tmp_path):
    unlimited = compact(write(str(tmp_path / "unlimited"), keyed=True), 1 << 30)
    limited = compact(write(str(tmp_path / "limited"), keyed=True), BUDGET)
    # the baseline: the same volume with no key state at all (keyless messages all survive)
    baseline = compact(write(str(tmp_path / "keyless"), keyed=False), BUDGET)

    u, r = unlimited["result"], limited["result"]
    assert u["status"] == "compacted" and u["spill_buckets"] == 0 and u["key_state_bytes"] >= 4 * BUDGET, u
    assert r["status"] == "compacted" and r["spill_buckets"] > 1 and r["key_state_bytes"] <= BUDGET, r
    assert u["distinct_keys"] == r["distinct_keys"] == KEYS
    # the map: 5 + 13 B of record and ~6 B of slots per key; the survivors: 2 bits per message
    assert u["key_state_bytes"] <= 25 * KEYS + MESSAGES // 3
    assert (r["messages_before"], r["messages_after"]) == (u["messages_before"], u["messages_after"])
    assert contents(str(tmp_path / "limited")) == contents(str(tmp_path / "unlimited"))
    assert verify_path(str(tmp_path / "limited")) == []

    assert baseline["result"]["key_state_bytes"] <= MESSAGES // 3  # no key: the survivors' two bits per message
    headroom = 6 * MiB  # the spill's buffers (1 MiB each way, and the records' columns), allocator noise
    assert limited["peak_rss"] <= baseline["peak_rss"] + BUDGET + headroom, (limited["peak_rss"], baseline["peak_rss"])
    assert unlimited["peak_rss"] > limited["peak_rss"]  # without the budget the key state does show
