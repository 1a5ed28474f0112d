"""Index rules (docs/FORMAT.md §4) against what the real broker wrote."""

import glob
import os
import struct

import pytest
from conftest import FIXTURES, data_dir

from tank_log.format.index import (
    build_append_rule,
    build_compaction_rule,
    build_rebuild_rule,
    encode_index,
    lookup,
    read_index,
    verify_index,
)
from tank_log.storage.datadir import partitions_at
from tank_log.storage.segment import Segment

D = os.path.join(FIXTURES, "D_index_rebuild")
SET_DATA = {"B_compaction_restart_after": os.path.join(FIXTURES, "B_compaction_restart", "after", "data")}


def segment_for(index_rel: str) -> Segment:
    """`<set>/<topic>/<partition>/<base>.index` → the segment log in the corresponding set's data/."""
    setname, topic, part, fname = index_rel.split(os.sep)
    root = SET_DATA.get(setname, os.path.join(FIXTURES, setname, "data"))
    base = fname.split(".")[0]
    pdir = os.path.join(root, topic, part)
    (log,) = [
        f for f in os.listdir(pdir) if f.endswith("log") and (f.startswith(base + "-") or f.startswith(base + "_"))
    ]
    return Segment(os.path.join(pdir, log))


REBUILT = sorted(
    os.path.relpath(p, os.path.join(D, "rebuilt"))
    for p in glob.glob(os.path.join(D, "rebuilt", "**", "*.index"), recursive=True)
)


@pytest.mark.parametrize("rel", REBUILT)
def test_rebuild_rule_equals_the_broker_rebuild(rel):
    seg = segment_for(rel)
    ours = encode_index(build_rebuild_rule(seg.bundles(), seg.base))
    with open(os.path.join(D, "rebuilt", rel), "rb") as fh:
        assert ours == fh.read()


def single_run_segments():
    """Segments written by appends in one broker run (not compaction outputs, not C_misc/restarted)."""
    out = []
    for name in ["A_multi", "C_misc", "E_before", "B_before", "M_mirror"]:
        for part in partitions_at(data_dir(name)):
            if part.topic == "restarted":
                continue
            for s in part.segments:
                out.append((s, part.config.index_interval_bytes))
    return out


def test_append_rule_equals_the_broker_indexes():
    segs = single_run_segments()
    assert len(segs) > 60
    for sf, interval in segs:
        seg = sf
        ours = encode_index(build_append_rule(seg.bundles(), seg.base, interval))
        with open(sf.index_path, "rb") as fh:
            assert ours == fh.read(), sf.path


def test_compaction_rule_equals_the_broker_compaction_index():
    """E_after's 2.index and 7136.index were written by the broker's compaction (§6.3 spacing)."""
    for part in partitions_at(data_dir("E_after")):
        for sf in part.ro[:2]:
            seg = sf
            with open(sf.index_path, "rb") as fh:
                assert encode_index(build_compaction_rule(seg.bundles(), seg.base)) == fh.read()


def test_lookup():
    entries = [(0, 0), (10, 100), (20, 250)]
    assert lookup(entries, 0) == (0, 0)
    assert lookup(entries, 15) == (10, 100)
    assert lookup(entries, 20) == (20, 250)
    assert lookup(entries, 10**9) == (20, 250)
    assert lookup([], 5) == (0, 0)


def _verify(sf, data):
    seg = sf
    headers = list(seg.bundles())
    return verify_index(sf.index_path, data, headers, sf.base, sf.size, active=sf.is_active)


@pytest.fixture
def small_segments():
    part = next(p for p in partitions_at(data_dir("A_multi")) if p.key == ("small", 0))
    return part.ro[0], part.active


def test_verify_detects_corruptions(small_segments):
    ro, active = small_segments
    good = open(ro.index_path, "rb").read()
    assert _verify(ro, good) == []
    entries = read_index(ro.index_path)
    cases = {
        "index-size": good[:-3],
        "index-first-entry": encode_index([(1, 0)] + entries[1:]),
        "index-order": encode_index([entries[0], entries[2], entries[1]] + entries[3:]),
        "index-seq-mismatch": encode_index([entries[0], (entries[1][0] + 1, entries[1][1])] + entries[2:]),
        "index-not-bundle-start": encode_index([entries[0], (entries[1][0], entries[1][1] + 1)] + entries[2:]),
        "index-past-eof": encode_index(entries + [(entries[-1][0] + 1000, ro.size + 10)]),
        "index-empty": b"",
    }
    for code, data in cases.items():
        codes = {p.code for p in _verify(ro, data)}
        assert code in codes, (code, codes)
    assert {p.code for p in _verify(ro, None)} == {"index-missing"}


def test_active_entry_at_eof_is_an_error(small_segments):
    _, active = small_segments
    entries = read_index(active.index_path)
    data = encode_index(entries + [(entries[-1][0] + 100, active.size)])
    problems = _verify(active, data)
    assert any(p.code == "index-past-eof" and "aborts" in p.message for p in problems)


def test_entries_are_little_endian_u32_pairs(small_segments):
    ro, _ = small_segments
    raw = open(ro.index_path, "rb").read()
    assert read_index(ro.index_path)[1] == struct.unpack_from("<II", raw, 8)
