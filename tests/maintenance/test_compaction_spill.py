"""Compaction past its key budget: key records spill to bucket files beside the data (docs/FORMAT.md §1.7: a
leading `.` keeps the broker away), are decided bucket by bucket, and never outlive the run that wrote them, not
even a run killed by SIGKILL (`repair` deletes them)."""

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT, copy_tree, tree_digest

from tank_log.format import native
from tank_log.format.bundle import Message
from tank_log.maintenance.compaction import CompactionOptions, compact_partition
from tank_log.maintenance.compaction.spill import KeySpill, mark_latest
from tank_log.maintenance.compaction.survivors import Bits
from tank_log.maintenance.verify import verify_path
from tank_log.storage.datadir import scan_data_dir
from tank_log.storage.partition_writer import write_partition
from tank_log.storage.repair import repair_partition
from tank_log.storage.writer import BundlePolicy


def _columns(keys):
    data = b"".join(keys)
    lens = np.array([len(k) for k in keys], np.int64)
    return data, np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.int64), lens


def test_a_bucket_whose_keys_do_not_fit_is_split_and_every_key_keeps_its_latest_ordinal(tmp_path, codec_core):
    rng = random.Random(5)
    keys = [b"k%d" % rng.randrange(3000) for _ in range(20_000)]
    data, key_off, key_len = _columns(keys)
    ords = np.arange(len(keys), dtype=np.uint64)
    spill = KeySpill(str(tmp_path), 1)  # one bucket for every key: it cannot fit the budget below
    try:
        spill.add(data, key_off, key_len, ords)
        spill.finish()
        bits = Bits()
        bits.reserve(len(keys))
        budget = 20_000 if native.compiled() else 100_000  # a fifth of what the keys take in one map
        found, largest = mark_latest(spill, budget, bits, len(keys))
    finally:
        spill.remove()
    latest = {k: i for i, k in enumerate(keys)}
    assert found == len(latest) and largest <= budget
    assert np.flatnonzero(bits.get(np.arange(len(keys)))).tolist() == sorted(latest.values())
    assert os.listdir(tmp_path) == []  # every bucket file, split ones included, is gone


COMPACT = """
import sys
from tank_log.maintenance.compaction import CompactionOptions, compact_partition
from tank_log.storage.datadir import scan_data_dir
(part,) = scan_data_dir(sys.argv[1]).partitions()
compact_partition(part, CompactionOptions(force=True, broker_stopped=True, key_state_budget=1 << 20))
"""


def _spill_files(part_dir):
    return [n for n in os.listdir(part_dir) if n.startswith(".compaction-spill-")]


@pytest.mark.slow
def test_a_run_killed_while_it_spills_leaves_the_partition_as_it_was_and_repair_removes_the_spill(tmp_path):
    src = str(tmp_path / "src")
    part_src = os.path.join(src, "kv", "0")
    msgs = (
        Message(i + 1, 1_700_000_000_000 + i, b"key-%09d" % (i * 7919 % 300_000), b"v%d" % i) for i in range(600_000)
    )
    write_partition(part_src, msgs, segment_bytes=4 << 20, policy=BundlePolicy(max_messages=100))
    with open(os.path.join(src, "kv", "config"), "w") as fh:
        fh.write("log.cleanup.policy=cleanup\n")
    before = tree_digest(src)
    reference = copy_tree(src, str(tmp_path / "reference"))
    (ref_part,) = scan_data_dir(reference).partitions()
    unlimited = compact_partition(ref_part, CompactionOptions(force=True, broker_stopped=True))
    assert unlimited.status == "compacted" and unlimited.spill_buckets == 0

    killed_with_spill = 0
    for k, delay in enumerate((0.0, 0.05, 0.15, 0.3)):
        base = copy_tree(src, str(tmp_path / f"k{k}"))
        part = os.path.join(base, "kv", "0")
        proc = subprocess.Popen([sys.executable, "-c", COMPACT, base], env={**os.environ, "PYTHONPATH": ROOT})
        deadline = time.monotonic() + 60
        while not _spill_files(part) and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if _spill_files(part):
            killed_with_spill += 1
            data = {k: v for k, v in tree_digest(base).items() if "/.compaction-spill-" not in k}
            assert data == before  # nothing but the spill (and the lock) was written yet
        repair_partition(part)
        assert _spill_files(part) == []
        assert not verify_path(base)
        (p,) = scan_data_dir(base).partitions()
        again = compact_partition(p, CompactionOptions(force=True, broker_stopped=True, key_state_budget=1 << 20))
        assert again.status in ("compacted", "nothing-to-do") and _spill_files(part) == []
        assert tree_digest(base) == tree_digest(reference)  # the same files as the run that spilled nothing
    assert killed_with_spill >= 2


def _pass1(inputs, budget, tmp_path, monkeypatch, from_columns):
    """Pass 1 over `inputs`: its survivors' bits and what it reports, from the message sets (as compaction runs)
    or, with `from_columns`, from every chunk decoded into columns first."""
    from tank_log.maintenance.compaction import passes
    from tank_log.maintenance.compaction.options import CompactionResult

    with monkeypatch.context() as m:
        if from_columns:
            m.setattr(passes, "add_walked", lambda *args: 0)
        res = CompactionResult("t", 0, str(tmp_path))
        survivors = passes.map_keys(inputs, budget, str(tmp_path), res)
    bits = (survivors.latest.bytes.tobytes().rstrip(b"\0"), survivors.marked.bytes.tobytes().rstrip(b"\0"))
    return bits, (res.distinct_keys, res.key_state_bytes, res.spill_buckets, res.spill_bytes)


@pytest.mark.skipif(not native.compiled(), reason="the pass from the message sets is the compiled core's")
def test_the_first_pass_from_the_message_sets_decides_as_from_decoded_columns(tmp_path, monkeypatch):
    """The first pass maps keys straight from each message set under a budget lowered for the marks the messages
    may hold; where that budget binds it hands over to the columns. Around the budgets where compaction starts to
    spill, the same bits, key state and spill as a pass over decoded columns, also with the 1 M messages a decode
    holds cut small (`DEFAULT_MAX_MESSAGES`)."""
    from tank_log.maintenance.compaction import passes

    rng = random.Random(3)
    msgs = []
    for seq in range(1, 200_001):
        value = b"" if seq > 150_000 and rng.random() < 0.01 else b"v%d" % seq  # the first marks come late
        msgs.append(Message(seq, seq, b"key-%06d" % rng.randrange(150_000), value))
    base = tmp_path / "data"
    policy = BundlePolicy(max_messages=100)
    write_partition(str(base / "t" / "0"), msgs, segment_bytes=1 << 20, with_active=False, policy=policy)
    (part,) = scan_data_dir(str(base)).partitions()
    for budget in (1_900_000, 2_020_000, 2_100_000, 2_200_000, 8_000_000):
        got = _pass1(part.ro, budget, tmp_path, monkeypatch, from_columns=False)
        assert got == _pass1(part.ro, budget, tmp_path, monkeypatch, from_columns=True), budget
        if budget == 2_020_000:
            assert got[1][2] > 0  # this budget spills
    monkeypatch.setattr(passes, "DEFAULT_MAX_MESSAGES", 250)
    small = _pass1(part.ro, 2_020_000, tmp_path, monkeypatch, from_columns=False)
    assert small == _pass1(part.ro, 2_020_000, tmp_path, monkeypatch, from_columns=True)
