"""Compaction (docs/FORMAT.md §6): agreement with the broker, Kafka-style invariants, crash safety, locking."""

import hashlib
import os
import random
import time
from dataclasses import replace

import pytest
from conftest import CRASHED, copy_tree, crash_after_step, data_dir, load_dump, tree_digest

from tank_log.format.bundle import Message, SnappyPolicy
from tank_log.maintenance.compaction import CompactionOptions, compact_partition
from tank_log.maintenance.verify import check_partition, verify_path
from tank_log.storage.cleanup_marks import read_cleanup_log
from tank_log.storage.datadir import scan_data_dir, scan_partition
from tank_log.storage.locking import PartitionLock
from tank_log.storage.partition_writer import write_partition
from tank_log.storage.repair import repair_partition
from tank_log.storage.writer import BundlePolicy

STOPPED = CompactionOptions(force=True, broker_stopped=True)


def messages_of(part_dir):
    part = scan_partition(part_dir, "t", 0)
    return [(m.seq, m.ts, m.key, m.value) for s in part.segments for m in s.messages()]


def only_partition(base):
    (part,) = scan_data_dir(base).partitions()
    return part


def test_agrees_with_the_broker_on_E(tmp_path):
    """E_compaction_exact: survivors with seq <= 8058 are exactly the broker's; the active segment is untouched."""
    base = copy_tree(data_dir("E_before"), str(tmp_path / "e"))
    part = only_partition(base)
    active_before = open(part.active.path, "rb").read()
    res = compact_partition(part, STOPPED, base_path=base)
    assert res.status == "compacted", res
    got = messages_of(part.path)
    expected = [m for m in load_dump("E_after")[("kv", 0)] if m[0] <= 8058]
    assert [m for m in got if m[0] <= 8058] == expected
    assert len(expected) == 1694 and expected[-1][0] == 8058  # the range's last message survives
    assert open(part.active.path, "rb").read() == active_before
    assert (res.tombstones_kept, res.keyless_kept, res.keyless_dropped) == (47, 296, 162)
    assert res.messages_before == 8058 and res.messages_after == 1694 and res.distinct_keys == 1398
    assert verify_path(base) == []
    assert read_cleanup_log(base) == {("kv", 0): 8058}
    assert res.bytes_after < res.bytes_before


def test_B_before_compacts_cleanly(tmp_path):
    base = copy_tree(data_dir("B_before"), str(tmp_path / "b"))
    res = compact_partition(only_partition(base), STOPPED, base_path=base)
    assert res.status == "compacted" and verify_path(base) == []
    got = messages_of(os.path.join(base, "kv", "0"))
    assert got[-1] == load_dump("B_before")[("kv", 0)][-1]  # active untouched, order preserved
    assert [m[0] for m in got] == sorted(m[0] for m in got)


def generated_partition(path, seed=1, n=6000, gaps=True, uniform_keys=None):
    """Keyless messages, tombstones and keyed ones (500 keys of a heavy-tailed popularity, or `uniform_keys`
    equally likely), seq gaps as earlier compactions leave, random bundle sizes and codecs."""
    rng = random.Random(seed)
    msgs, seq = [], 1
    for i in range(n):
        r = rng.random()
        if r < 0.05:
            key, value = None, b""
        elif r < 0.12:
            key, value = None, b"keyless %d" % i
        else:
            k = rng.randrange(uniform_keys) if uniform_keys else int(rng.paretovariate(1.1) % 500)
            key = b"key-%d" % k
            value = b"" if rng.random() < 0.06 else (b"v%d-" % i) * rng.randrange(1, 20)
        msgs.append(Message(seq, 1_700_000_000_000 + i * 1000, key, value))
        seq += 1 + (rng.randrange(1, 4) if gaps and rng.random() < 0.05 else 0)  # gaps from earlier compactions
    policy = BundlePolicy(max_messages=rng.choice([1, 7, 50]), snappy=rng.choice(list(SnappyPolicy)))
    write_partition(path, msgs, segment_bytes=16 << 10, policy=policy)
    return msgs


def expected_survivors(msgs, last_seq, drop_keyless=False, tomb_cutoff=None):
    latest = {}
    for m in msgs:
        if m.seq <= last_seq and m.key:
            latest[m.key] = m.seq
    out = []
    for m in msgs:
        if m.seq > last_seq:
            out.append(m)
        elif m.seq == last_seq:
            out.append(m)  # always kept
        elif m.key:
            if latest[m.key] == m.seq and not (tomb_cutoff is not None and not m.value and m.ts < tomb_cutoff):
                out.append(m)
        elif m.value and not drop_keyless:
            out.append(m)
    return [(m.seq, m.ts, m.key, m.value) for m in out]


@pytest.mark.parametrize("seed", range(6))
def test_invariants_on_generated_data(tmp_path, seed):
    d = str(tmp_path / "t" / "0")
    msgs = generated_partition(d, seed)
    part = scan_partition(d, "t", 0)
    last_ro = part.ro[-1].last
    size_before = sum(s.size for s in part.segments)
    res = compact_partition(part, STOPPED)
    assert res.status == "compacted", res
    got = messages_of(d)
    assert got == expected_survivors(msgs, last_ro)
    part = scan_partition(d, "t", 0)
    assert [p for p in check_partition(part) if p.severity == "error"] == []
    assert sum(s.size for s in part.segments) < size_before
    # compacting again changes nothing
    digest = tree_digest(d)
    again = compact_partition(part, STOPPED)
    assert again.status == "nothing-to-do" and again.reason == "no message would be dropped"
    assert tree_digest(d) == digest


@pytest.mark.parametrize("seed", range(3))
def test_keys_past_a_small_key_budget_spill_and_leave_the_in_memory_result(tmp_path, seed, codec_core):
    """Keys that do not fit `key_state_budget` spill to bucket files and are decided bucket by bucket: the same
    survivors, byte for byte, as with the keys in memory; the key state stays within the budget; no spill file is
    left."""
    d = str(tmp_path / "t" / "0")
    msgs = generated_partition(d, seed, uniform_keys=3000)  # ~2,600 distinct keys: ~40 KB of key state in memory
    ref = copy_tree(d, str(tmp_path / "ref" / "t" / "0"))
    part = scan_partition(d, "t", 0)
    last_ro = part.ro[-1].last
    cutoff_ms = msgs[len(msgs) // 3].ts
    now = 1_700_000_000_000 + 10**9
    opts = CompactionOptions(
        force=True,
        broker_stopped=True,
        key_state_budget=10_000,
        drop_keyless=seed == 1,
        tombstone_retention_ms=now - cutoff_ms if seed == 2 else None,
        now_ms=now,
    )
    res = compact_partition(part, opts)
    assert res.status == "compacted" and res.spill_buckets > 1 and res.spill_bytes > 0, res
    assert res.key_state_bytes <= 10_000 and res.outputs, res
    expected = expected_survivors(msgs, last_ro, drop_keyless=seed == 1, tomb_cutoff=cutoff_ms if seed == 2 else None)
    assert messages_of(d) == expected
    assert res.messages_before == len([m for m in msgs if m.seq <= last_ro])
    assert res.messages_after == len([m for m in expected if m[0] <= last_ro])
    assert res.distinct_keys == len({m.key for m in msgs if m.key and m.seq <= last_ro})
    assert [p for p in check_partition(scan_partition(d, "t", 0)) if p.severity == "error"] == []
    assert not [n for n in os.listdir(d) if n.startswith(".") and n != ".tank-log.lock"]
    in_memory = compact_partition(scan_partition(ref, "t", 0), replace(opts, key_state_budget=1 << 30))
    assert in_memory.spill_buckets == 0
    assert tree_digest(d) == tree_digest(ref)  # the same files, byte for byte


def test_a_budget_that_holds_no_key_changes_nothing(tmp_path, codec_core):
    d = str(tmp_path / "t" / "0")
    generated_partition(d, 4)
    digest = tree_digest(d)
    res = compact_partition(
        scan_partition(d, "t", 0), CompactionOptions(force=True, broker_stopped=True, key_state_budget=100)
    )
    assert res.status == "needs-attention" and "key_state_budget" in res.reason, res
    assert tree_digest(d) == digest


def test_options_tombstone_retention_and_drop_keyless(tmp_path):
    d = str(tmp_path / "t" / "0")
    msgs = generated_partition(d, seed=11)
    part = scan_partition(d, "t", 0)
    last_ro = part.ro[-1].last
    cutoff_ms = msgs[len(msgs) // 2].ts
    now = 1_700_000_000_000 + 10**9
    opts = CompactionOptions(
        force=True, broker_stopped=True, drop_keyless=True, tombstone_retention_ms=now - cutoff_ms, now_ms=now
    )
    res = compact_partition(part, opts)
    assert res.status == "compacted" and res.tombstones_dropped > 0 and res.keyless_kept <= 1
    assert messages_of(d) == expected_survivors(msgs, last_ro, drop_keyless=True, tomb_cutoff=cutoff_ms)


def test_planning_ratio_lag_and_dry_run(tmp_path):
    base = copy_tree(data_dir("E_before"), str(tmp_path / "e"))
    part = only_partition(base)
    res = compact_partition(part, CompactionOptions(broker_stopped=True), cleanup_mark=8058)
    assert res.status == "nothing-to-do" and "dirty ratio 0.0" in res.reason
    digest = tree_digest(base, include_lock=True)
    res = compact_partition(part, CompactionOptions(broker_stopped=True, dry_run=True), cleanup_mark=0)
    assert res.status == "dry-run" and res.messages_after == 1694 and res.bytes_after is None
    assert tree_digest(base, include_lock=True) == digest  # dry run touches nothing, not even a lock file
    # a lag that excludes every segment (message ts are from 2025; "now" = ts of the last message + 1 min)
    lag = CompactionOptions(broker_stopped=True, force=True, min_compaction_lag_ms=10**15)
    assert compact_partition(part, lag).reason == "no RO segment old enough"


def test_refuses_a_live_partition(tmp_path):
    base = copy_tree(data_dir("E_before"), str(tmp_path / "e"))
    part = only_partition(base)
    os.utime(part.active.path, (time.time(), time.time()))
    res = compact_partition(part, CompactionOptions(force=True))
    assert res.status == "failed" and "broker stopped" in res.error and "--broker-stopped" in res.error


def test_lock_makes_the_second_run_skip(tmp_path):
    base = copy_tree(data_dir("E_before"), str(tmp_path / "e"))
    part = only_partition(base)
    with PartitionLock(part.path, "other-job"):
        res = compact_partition(part, STOPPED)
    assert res.status == "skipped" and "locked" in res.reason and "other-job" in res.reason


def test_two_concurrent_processes(tmp_path):
    """Process A compacts (slowed down inside the protocol); B starts meanwhile and must skip."""
    base = copy_tree(data_dir("E_before"), str(tmp_path / "e"))
    r, w = os.pipe()
    done_r, done_w = os.pipe()  # B's result, back to A: A holds its lock until B has tried
    pid = os.fork()
    if pid == 0:  # A
        os.close(r)
        os.close(done_w)

        def hook(step, fired=[False]):  # noqa: B006
            if not fired[0]:
                fired[0] = True
                os.write(w, b"x")
                os.read(done_r, 1)  # held inside the protocol until B has run, however long B takes

        res = compact_partition(only_partition(base), STOPPED, on_step=hook)
        os._exit(0 if res.status == "compacted" else 3)
    os.close(w)
    os.close(done_r)
    assert os.read(r, 1) == b"x"
    try:
        res_b = compact_partition(only_partition(base), STOPPED)
    finally:
        os.write(done_w, b"x")  # A goes on (also when B raised: no hung child)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert res_b.status == "skipped" and "locked" in res_b.reason


def _run_and_crash(base, k):
    """A compaction that dies right after file operation number k."""
    return crash_after_step(
        k, lambda hook: compact_partition(only_partition(base), STOPPED, base_path=base, on_step=hook)
    )


def test_crash_at_every_step_then_repair(tmp_path):
    src = data_dir("E_before")
    original = messages_of(os.path.join(src, "kv", "0"))
    ref = copy_tree(src, str(tmp_path / "ref"))
    steps = []
    compact_partition(only_partition(ref), STOPPED, base_path=ref, on_step=steps.append)
    compacted = messages_of(os.path.join(ref, "kv", "0"))
    assert len(steps) > 20 and compacted != original
    outcomes = set()
    for k in range(1, len(steps) + 1):
        base = copy_tree(src, str(tmp_path / f"k{k}"))
        assert _run_and_crash(base, k) == CRASHED, f"step {k} ({steps[k - 1]}) did not crash"
        pdir = os.path.join(base, "kv", "0")
        repair_partition(pdir)
        got = messages_of(pdir)
        assert got in (original, compacted), f"crash after step {k}: {steps[k - 1]}"
        outcomes.add("original" if got == original else "compacted")
        problems = [p for p in verify_path(base) if p.severity == "error"]
        assert problems == [], (k, steps[k - 1], problems)
        assert not repair_partition(pdir).has_work  # repair is idempotent
    assert outcomes == {"original", "compacted"}


def test_legacy_names_with_microsecond_timestamps(tmp_path):
    """Inputs with ts-less (legacy) names whose messages carry µs timestamps (beyond u32 seconds when read as
    ms): the output name ts must fit u32 and be truthful enough for age retention (§9 rule 6), never fail."""
    d = str(tmp_path / "t" / "0")
    os.makedirs(d)
    now_us = int(time.time() * 1_000_000)
    msgs = [Message(i, now_us + i, b"k%d" % (i % 3), b"v%d" % i * 40) for i in range(1, 301)]
    write_partition(d, msgs, segment_bytes=2000, policy=BundlePolicy(max_messages=4))
    for n in os.listdir(d):  # strip the timestamps: legacy names <base>-<last>.ilog (§2.1)
        if n.endswith(".ilog"):
            os.rename(os.path.join(d, n), os.path.join(d, n.split("_")[0] + ".ilog"))
    part = scan_partition(d, "t", 0)
    assert all(s.ts is None for s in part.ro) and len(part.ro) >= 3
    res = compact_partition(part, STOPPED)
    assert res.status == "compacted", res
    after = scan_partition(d, "t", 0)
    assert not [n for n in os.listdir(d) if n.startswith(".") and n != ".tank-log.lock"]
    for s in after.ro:
        assert s.ts is not None and 0 < s.ts < 2**32
        assert abs(s.ts - time.time()) < 3600  # the clock: the messages' ts are not seconds-since-epoch in ms
    assert [p for p in check_partition(after) if p.severity == "error"] == []


def test_outputs_roll_before_a_relative_seq_beyond_2_31(tmp_path):
    """An input whose seqs jump past base + 2**31 (sparse bundles may) made compaction fail with an
    internal ValueError; outputs roll instead, so no output needs the unimplemented _64 index (§4.6)."""
    from tank_log.format.bundle import encode_bundle, frame

    far = (1 << 31) + 10
    pdir = tmp_path / "t" / "0"
    pdir.mkdir(parents=True)
    b1 = frame(encode_bundle([Message(1, 1000, b"a", b"old"), Message(2, 1000, b"b", b"v")], sparse=True))
    b2 = frame(encode_bundle([Message(far, 2000, b"a", b"new"), Message(far + 1, 2000, b"c", b"v")], sparse=True))
    (pdir / f"1-{far + 1}_1795000000.ilog").write_bytes(b1 + b2)
    (pdir / f"{far + 2}_1795000001.log").write_bytes(
        frame(encode_bundle([Message(far + 2, 3000, b"d", b"v")], sparse=False))
    )
    part = scan_partition(str(pdir), "t", 0)
    res = compact_partition(part, CompactionOptions(force=True, broker_stopped=True))
    assert res.status == "compacted", res
    after = scan_partition(str(pdir), "t", 0)
    assert [(s.base, s.last) for s in after.ro] == [(2, 2), (far, far + 1)]
    assert [m.seq for s in after.segments for m in s.messages()] == [2, far, far + 1, far + 2]
    assert not [p for p in check_partition(after) if p.severity == "error"]


def mostly_superseded_partition(path, seed):
    """Keys overwritten many times, tombstones and keyless messages in a few places only: most bundles hold no
    survivor, so pass 2 can skip them whole."""
    rng = random.Random(seed)
    msgs = []
    for i in range(12_000):
        key = b"key-%d" % rng.randrange(300)
        value = b"" if 3000 <= i < 3100 and rng.random() < 0.3 else b"value %d " % i * rng.randrange(1, 6)
        if 7000 <= i < 7050 and i % 3:
            key, value = None, b"" if i % 2 else b"keyless %d" % i
        msgs.append(Message(i + 1, 1_700_000_000_000 + i * 1000, key, value))
    write_partition(path, msgs, segment_bytes=64 << 10, policy=BundlePolicy(max_messages=20))
    return msgs


@pytest.mark.parametrize("budget", [None, 6_000], ids=["in-memory", "spilled"])
@pytest.mark.parametrize("drop_keyless,tombstones", [(False, False), (True, True)], ids=["plain", "retention"])
def test_bundles_without_survivors_are_skipped_and_the_counts_stay_exact(
    tmp_path, codec_core, budget, drop_keyless, tombstones
):
    d = str(tmp_path / "t" / "0")
    msgs = mostly_superseded_partition(d, 7)
    part = scan_partition(d, "t", 0)
    last_ro = part.ro[-1].last
    bundles = sum(1 for s in part.ro for _ in s.bundles())
    now = 1_700_000_000_000 + 10**9
    cutoff = msgs[3050].ts if tombstones else None
    opts = CompactionOptions(
        force=True,
        broker_stopped=True,
        drop_keyless=drop_keyless,
        tombstone_retention_ms=None if cutoff is None else now - cutoff,
        now_ms=now,
        **({} if budget is None else {"key_state_budget": budget}),
    )
    res = compact_partition(part, opts)
    expected = expected_survivors(msgs, last_ro, drop_keyless, cutoff)
    assert res.status == "compacted" and messages_of(d) == expected
    assert (res.spill_buckets > 0) == (budget is not None), res
    assert res.bundles_skipped > bundles // 2, (res.bundles_skipped, bundles)
    ro_msgs = [m for m in msgs if m.seq <= last_ro]
    kept = {m[0] for m in expected}
    tombs = [m for m in ro_msgs if m.key and not m.value]
    keyless = [m for m in ro_msgs if not m.key]
    assert res.messages_after == len([s for s in kept if s <= last_ro])
    assert (res.tombstones_kept, res.keyless_kept) == (
        len([m for m in tombs if m.seq in kept]),
        len([m for m in keyless if m.seq in kept]),
    )
    assert (res.tombstones_dropped, res.keyless_dropped) == (
        len([m for m in tombs if m.seq not in kept]),
        len([m for m in keyless if m.seq not in kept]),
    )
    assert [p for p in check_partition(scan_partition(d, "t", 0)) if p.severity == "error"] == []


def client_bundled_partition(path, n=6000):
    """Messages as TANK clients produce them (100-message Snappy bundles), keys alternately unique (1,000 messages
    over a million keys: their bundles keep every message and are copied whole) and hot (1,000 over 300 keys: their
    survivors are re-encoded)."""
    rng = random.Random(7)
    msgs = []
    for i in range(n):
        r = rng.random()
        keys = 1_000_000 if i % 2000 < 1000 else 300
        key = None if r < 0.03 else b"user:%06d" % rng.randrange(keys)
        value = b"" if 0.03 <= r < 0.05 else b'{"i":%d,"note":"%s"}' % (i, b"x" * rng.randrange(40, 120))
        msgs.append(Message(i + 1, 1_700_000_000_000 + i * 10, key, value))
    policy = BundlePolicy(max_messages=100, max_bytes=1 << 30, snappy=SnappyPolicy.CLIENT)
    write_partition(path, msgs, segment_bytes=64 << 10, policy=policy)


# SHA-256 over the compacted partition's files (name and content, by name) as compaction wrote them on 2026-11-25:
# a change of the compaction's speed must leave its output byte for byte as it was.
OUTPUT_DIGESTS = {
    "heavy-tailed keys": "faec9a7fd4110bd7676f0f5277bac1a4b09d93c524fad426dfd07af6ba69b75a",
    "client bundles": "bc235a6f264df9e79f381086794bc54aabca807247939e81e7ee6eedaca92773",
}


@pytest.mark.parametrize("shape", sorted(OUTPUT_DIGESTS))
def test_output_is_byte_for_byte_as_before(tmp_path, shape, codec_core):
    d = str(tmp_path / "t" / "0")
    if shape == "client bundles":
        client_bundled_partition(d)
    else:
        generated_partition(d, 1)
    res = compact_partition(scan_partition(d, "t", 0), STOPPED)
    assert res.status == "compacted", res
    digest = hashlib.sha256()
    for name, content in sorted(tree_digest(d).items()):
        digest.update(name.encode() + b"\0" + content)
    assert digest.hexdigest() == OUTPUT_DIGESTS[shape]
