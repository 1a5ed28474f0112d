"""The live appender writes what the broker's produce path writes (TANK_FORMAT.md §2.3–§2.5, §4.3)."""

import os

import pytest

from tank_log.format.bundle import Message
from tank_log.format.index import read_index
from tank_log.maintenance.verify import verify_path
from tank_log.storage.appender import PartitionAppender
from tank_log.storage.datadir import partitions_at, scan_partition


def msgs(lo, hi, step=1):
    return [Message(s, 1_800_000_000_000 + s, b"k%d" % (s % 7), b"value %d" % s) for s in range(lo, hi + 1, step)]


def test_appends_roll_and_index_like_the_broker(tmp_path):
    path = tmp_path / "t" / "0"
    app = PartitionAppender(path, segment_bytes=600, index_interval=128)
    for lo in range(1, 200, 10):
        app.append(msgs(lo, lo + 9))
    app.append(msgs(230, 250, 5))  # a sparse bundle after a gap
    part = scan_partition(str(path), "t", 0)
    assert [m.seq for s in part.segments for m in s.messages()] == list(range(1, 201)) + list(range(230, 251, 5))
    assert len(part.ro) >= 2 and all(s.size > 600 for s in part.ro)  # rolled once > 600 bytes (§2.4 rule 4)
    assert all(s.last == 10 * (s.last // 10) for s in part.ro)  # at bundle boundaries
    assert part.active is not None and part.active.base == part.ro[-1].last + 1  # a roll never leaves a gap
    for s in part.segments:
        entries = read_index(s.index_path)
        assert entries[0] == (0, 0) and len(entries) > 1  # first bundle indexed, then by the interval (§4.3)
    assert app.rolls == len(part.ro)
    assert verify_path(str(tmp_path)) == []


def test_reopen_continues_the_active_segment(tmp_path):
    path = tmp_path / "t" / "0"
    PartitionAppender(path).append(msgs(1, 10))
    app = PartitionAppender(path)
    assert app.next_seq == 11
    app.append(msgs(11, 20))
    (part,) = partitions_at(str(tmp_path))
    assert part.ro == [] and [m.seq for m in part.active.messages()] == list(range(1, 21))
    with pytest.raises(ValueError, match="does not follow 20"):
        app.append(msgs(20, 21))
    assert verify_path(str(tmp_path)) == []


def test_rolls_at_the_topics_segment_size(tmp_path):
    """The topic's `config` applies to its partitions (§1.5): an appender given no size rolls at the topic's
    log.segment.bytes (it read the partition's own config only, and rolled at the 1 GiB default)."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config").write_text("log.segment.bytes=600\n")
    app = PartitionAppender(tmp_path / "t" / "0")
    assert app.segment_bytes == 600
    for lo in range(1, 100, 10):
        app.append(msgs(lo, lo + 9))
    (part,) = partitions_at(str(tmp_path))
    assert len(part.ro) >= 2 and app.rolls == len(part.ro)


def test_a_roll_never_leaves_a_gap_before_the_active_segment(tmp_path):
    """TANK_FORMAT.md §11 item 23: the broker aborts on a fetch inside a seq gap between the last RO segment and the
    active segment (§4.4). The appender rolled at the first bundle after the segment grew past log.segment.bytes,
    whatever its seqs, so a bundle jumping the counter there started the active segment after the gap; it now
    keeps such a bundle in the segment and rolls at the next bundle that continues the counter."""
    path = tmp_path / "t" / "0"
    app = PartitionAppender(path, segment_bytes=200)
    seq, written = 1, []
    for b in range(12):
        bundle = msgs(seq, seq + 2)
        app.append(bundle)
        written += [m.seq for m in bundle]
        seq += 3 + (100 if b % 2 else 0)  # every second bundle is followed by a jump
    part = scan_partition(str(path), "t", 0)
    assert [m.seq for s in part.segments for m in s.messages()] == written
    assert len(part.ro) >= 3 and app.rolls == len(part.ro)
    for before, after in zip(part.segments, part.segments[1:], strict=False):
        assert after.base == before.last + 1  # every roll where seqs continue: no boundary holds a gap
    assert any(s.last - s.base + 1 > sum(1 for _ in s.messages()) for s in part.ro)  # the gaps, inside segments
    assert verify_path(str(tmp_path)) == []  # which reports a gap before the active segment


def test_a_jump_at_every_bundle_keeps_one_growing_segment(tmp_path):
    path = tmp_path / "t" / "0"
    app = PartitionAppender(path, segment_bytes=200)
    for lo in range(1, 2000, 100):
        app.append(msgs(lo, lo + 2))
    part = scan_partition(str(path), "t", 0)
    assert part.ro == [] and part.active is not None and part.active.size > 5 * 200  # never a place to roll
    assert app.rolls == 0 and verify_path(str(tmp_path)) == []


def test_refuses_a_gap_with_no_active_segment_to_hold_it(tmp_path):
    """RO segments and no active one (§2.6): a jumping bundle would start the active segment after a gap."""
    path = tmp_path / "t" / "0"
    app = PartitionAppender(path, segment_bytes=100)
    app.append(msgs(1, 10))
    app.append(msgs(11, 20))  # rolls: 1-10 RO, 11.. active
    active = scan_partition(str(path), "t", 0).active
    assert active is not None
    os.rename(active.path, path / f"11-20_{int(os.path.getmtime(active.path))}.ilog")  # sealed by hand
    before = sorted(os.listdir(path))
    app = PartitionAppender(path)
    with pytest.raises(ValueError, match=r"seq 50 does not continue 20 .*§4\.4"):
        app.append(msgs(50, 52))
    assert sorted(os.listdir(path)) == before  # nothing written
    app.append(msgs(21, 22))  # continuing the counter starts the active segment as the broker would
    part = scan_partition(str(path), "t", 0)
    assert part.active is not None and part.active.base == 21 and verify_path(str(tmp_path)) == []


def test_refuses_a_jump_past_the_index_reach_of_the_active_segment(tmp_path):
    """A jump of 2**31 or more cannot stay in the segment (§4.6) nor start a new one (§4.4): refused, not written."""
    path = tmp_path / "t" / "0"
    app = PartitionAppender(path)
    app.append(msgs(1, 3))
    size = os.path.getsize(scan_partition(str(path), "t", 0).active.path)
    with pytest.raises(ValueError, match=r"2\*\*31 or more past the active segment's base 1"):
        app.append(msgs((1 << 31) + 1, (1 << 31) + 1))  # 2**31 past base 1
    assert os.path.getsize(scan_partition(str(path), "t", 0).active.path) == size
    app.append(msgs(4, 5))
    assert app.last == 5 and verify_path(str(tmp_path)) == []
