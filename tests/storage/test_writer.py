"""Segments we write follow Appendix B and read back exactly."""

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tank_log.errors import TankFormatError
from tank_log.format.bundle import Message, SnappyPolicy
from tank_log.format.index import build_append_rule, encode_index
from tank_log.maintenance.verify import check_partition
from tank_log.storage.datadir import scan_partition
from tank_log.storage.partition_writer import write_partition
from tank_log.storage.segment import Segment
from tank_log.storage.writer import BundlePolicy, SegmentWriter, write_segment


def gen_messages(rng, n, start=1, gaps=True):
    out, seq = [], start
    for _ in range(n):
        key = None if rng.random() < 0.2 else b"k%d" % rng.randrange(50)
        out.append(Message(seq, 1_700_000_000_000 + seq // 3, key, b"v" * rng.randrange(0, 300)))
        seq += 1 + (rng.randrange(5) if gaps and rng.random() < 0.1 else 0)
    return out


def test_write_and_read_back(tmp_path):
    msgs = gen_messages(random.Random(1), 3000)
    w = write_segment(tmp_path, msgs, ts=1795000000, policy=BundlePolicy(max_messages=50))
    assert w.log_name == f"1-{msgs[-1].seq}_1795000000.ilog"
    assert sorted(os.listdir(tmp_path)) == sorted([w.log_name, "1.index"])  # no temp files left
    assert list(Segment(w.log_path).messages()) == msgs
    seg = Segment(w.log_path)
    assert open(w.index_path, "rb").read() == encode_index(build_append_rule(seg.bundles(), 1))


def test_sparse_only_when_needed(tmp_path):
    contiguous = [Message(i, 0, None, b"x") for i in range(10, 30)]
    os.makedirs(tmp_path / "a")
    w = write_segment(tmp_path / "a", contiguous, policy=BundlePolicy(max_messages=7))
    assert not any(h.sparse for h in Segment(w.log_path).bundles())
    gappy = contiguous[:5] + [Message(100, 0, None, b"y")] + [Message(101, 0, None, b"z")]
    os.makedirs(tmp_path / "b")
    w = write_segment(tmp_path / "b", gappy, policy=BundlePolicy(max_messages=3))
    # [10,11,12] [13,14,100] [101]: only the bundle with the gap is sparse; [101] continues the counter
    assert [h.sparse for h in Segment(w.log_path).bundles()] == [False, True, False]
    more = gappy + [Message(102 + i, 0, None, b"w") for i in range(3)]
    os.makedirs(tmp_path / "c")
    w = write_segment(tmp_path / "c", more, policy=BundlePolicy(max_messages=3))
    assert [h.sparse for h in Segment(w.log_path).bundles()] == [False, True, False, False]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from(list(SnappyPolicy)), st.integers(1, 120))
def test_property_partition_round_trip(tmp_path_factory, seed, snappy, bundle_size):
    d = tmp_path_factory.mktemp("p")
    msgs = gen_messages(random.Random(seed), 800)
    write_partition(d, msgs, segment_bytes=4 << 10, policy=BundlePolicy(max_messages=bundle_size, snappy=snappy))
    part = scan_partition(str(d), "t", 0)
    assert part.active is not None and len(part.ro) >= 1
    got = [m for s in part.segments for m in s.messages()]
    assert got == msgs
    assert [p for p in check_partition(part) if p.severity == "error"] == []


def test_active_segment_and_abort(tmp_path):
    w = SegmentWriter(tmp_path, active=True, ts=42)
    w.add(Message(5, 1, None, b"a"))
    done = w.close()
    assert os.path.basename(done.log_path) == "5_42.log"
    w2 = SegmentWriter(tmp_path)
    w2.add(Message(9, 1, None, b"a"))
    w2.flush_bundle()
    w2.abort()
    assert sorted(os.listdir(tmp_path)) == ["5.index", "5_42.log"]


def test_rejects_bad_input(tmp_path):
    w = SegmentWriter(tmp_path)
    w.add(Message(5, 1, None, b"a"))
    with pytest.raises(ValueError):
        w.add(Message(5, 1, None, b"b"))
    with pytest.raises(ValueError):
        w.add(Message(6, 1, b"k" * 256, b"b"))
    w.abort()
    with pytest.raises(FileExistsError):
        write_segment(tmp_path, [Message(1, 0, None, b"x")], ts=1)
        write_segment(tmp_path, [Message(1, 0, None, b"x")], ts=1)


def test_copy_encoded_bundles(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    w = write_segment(src, gen_messages(random.Random(3), 500), ts=1)
    dst = tmp_path / "dst"
    dst.mkdir()
    raw = open(w.log_path, "rb").read()
    out = SegmentWriter(dst, ts=1)
    for h in Segment(w.log_path).bundles():
        out.add_bundle(raw[h.offset : h.end], h.first_seq, h.last_seq, h.count, sparse=h.sparse)
    copy = out.close()
    assert open(copy.log_path, "rb").read() == raw


def test_a_seq_gap_beyond_u32_starts_a_new_bundle(tmp_path):
    """A sparse bundle's span is a u32 varint (§3.3); a gap beyond it raised ValueError mid-compaction."""
    gap = (1 << 32) + 7
    msgs = [Message(1, 1, b"a", b"x"), Message(2, 1, b"b", b"y"), Message(2 + gap, 2, b"c", b"z")]
    w = SegmentWriter(tmp_path, policy=BundlePolicy(max_messages=100))
    for m in msgs[:2]:
        w.add(m)
    w.add(msgs[2])  # would not fit one sparse bundle with the first two
    assert w.bundles == 1  # the first two were flushed as their own bundle
    written = w.finish()
    assert written.bundles == 2


def _segment_with_index(tmp_path, sparse: bool):
    """An RO segment of 1-message bundles (sparse ones with seq gaps when `sparse`) with an index entry per bundle."""
    seqs = [1, *range(10, 10 + 3 * 60, 3)] if sparse else list(range(1, 62))
    msgs = [Message(s, 1_700_000_000_000, b"k%d" % s, b"v" * 50) for s in seqs]
    w = write_segment(tmp_path, msgs, ts=1795000000, policy=BundlePolicy(max_messages=1), index_interval=0)
    return Segment(os.path.join(tmp_path, w.log_name)), seqs


@pytest.mark.parametrize("sparse", [True, False])
def test_an_index_entry_that_contradicts_the_data_is_an_error_not_other_seqs(tmp_path, sparse):
    """A read from an index entry numbered messages differently from a full scan, silently."""
    from tank_log.format.index import read_index

    seg, seqs = _segment_with_index(tmp_path, sparse)
    entries = read_index(seg.index_path)
    i = len(entries) // 2
    rel, off = entries[i]
    entries[i] = (rel - 1, off)  # the entry now claims the bundle there starts one seq earlier
    with open(seg.index_path, "wb") as fh:
        fh.write(encode_index(entries))
    with pytest.raises(TankFormatError, match=r"index entry \(rel") as err:
        seg.check_headers()
    assert err.value.path == seg.index_path and err.value.offset == off
    if sparse:  # the bundle there carries its absolute seq: a seek detects the contradiction by itself
        with pytest.raises(TankFormatError, match="index and data disagree") as err:
            list(seg.batches(min_seq=seg.base + rel - 1))
        assert err.value.path == seg.path and err.value.offset == off
    assert [m.seq for m in seg.messages()] == seqs  # a full scan is not affected
