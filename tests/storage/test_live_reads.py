"""Reading ranges planned before the broker rolled, compacted or deleted their segments (TANK_FORMAT.md §9 rule 2):
every message that still exists is read once, and what retention deleted is reported."""

import os
import shutil

from tank_log.format.bundle import Message
from tank_log.storage.appender import PartitionAppender
from tank_log.storage.datadir import last_complete_seq, scan_partition
from tank_spark.ranges import Bounds, partition_ranges, plan_ranges, read_range


def msgs(lo, hi):
    return [Message(s, 1_800_000_000_000 + s, None, b"value %d" % s) for s in range(lo, hi + 1)]


def seqs_of(ranges, lost=None):
    return [s for r in ranges for b in read_range(r, lost=lost) for s in b.column("seq").to_pylist()]


def test_a_rolled_active_segment_is_followed_to_its_ro_name(tmp_path):
    app = PartitionAppender(tmp_path / "t" / "0", segment_bytes=500)
    for lo in range(1, 100, 10):
        app.append(msgs(lo, lo + 9))
    bounded = plan_ranges([str(tmp_path)], Bounds(seq_ranges={("t", 0): (1, 100)}), True, 1 << 20)
    open_ended = plan_ranges([str(tmp_path)], Bounds(), True, 1 << 20)
    rolls = app.rolls
    for lo in range(101, 200, 10):  # rolls the active segment both plans read
        app.append(msgs(lo, lo + 9))
    assert app.rolls > rolls
    lost: list = []
    assert seqs_of(bounded, lost) == list(range(1, 101)) and lost == []
    was_active = next(sf for sf in scan_partition(str(tmp_path / "t" / "0"), "t", 0).ro if sf.base == bounded[-1].base)
    assert seqs_of(open_ended) == list(range(1, was_active.last + 1))  # an open-ended read: to its RO name's end


def test_segments_deleted_by_retention_are_reported_lost(tmp_path):
    app = PartitionAppender(tmp_path / "t" / "0", segment_bytes=300)
    for lo in range(1, 100, 10):
        app.append(msgs(lo, lo + 9))
    ranges = plan_ranges([str(tmp_path)], Bounds(seq_ranges={("t", 0): (5, 100)}), True, 1 << 20)
    part = scan_partition(str(tmp_path / "t" / "0"), "t", 0)
    gone = part.ro[:2]
    for sf in gone:  # retention: the front segments and their indexes (§5)
        os.unlink(sf.path)
        os.unlink(sf.index_path)
    lost: list = []
    assert seqs_of(ranges, lost) == list(range(gone[-1].last + 1, 101))
    assert lost == [("t", 0, 5, gone[0].last), ("t", 0, gone[1].base, gone[1].last)]


def test_the_last_complete_seq_follows_a_roll_after_the_scan(tmp_path):
    """The streaming source's latest offset and the export's plan: a roll between scan and read re-scans (§2.5)."""
    app = PartitionAppender(tmp_path / "t" / "0", segment_bytes=500)
    app.append(msgs(1, 10))
    scanned = scan_partition(str(tmp_path / "t" / "0"), "t", 0)
    assert scanned.active is not None and last_complete_seq(scanned) == 10
    rolls = app.rolls
    for lo in range(11, 100, 10):  # renames the scanned active segment to its RO name
        app.append(msgs(lo, lo + 9))
    assert app.rolls > rolls and not os.path.exists(scanned.active.path)
    assert last_complete_seq(scanned) == 100


def test_the_last_complete_seq_of_a_deleted_partition_is_none(tmp_path):
    app = PartitionAppender(tmp_path / "t" / "0")
    app.append(msgs(1, 10))
    scanned = scan_partition(str(tmp_path / "t" / "0"), "t", 0)
    shutil.rmtree(tmp_path / "t" / "0")
    assert last_complete_seq(scanned) is None


def test_a_segment_rolled_between_scan_and_planning_is_read_whole(tmp_path):
    app = PartitionAppender(tmp_path / "t" / "0", segment_bytes=5000, index_interval=100)
    for lo in range(1, 100, 10):
        app.append(msgs(lo, lo + 9))
    scanned = scan_partition(str(tmp_path / "t" / "0"), "t", 0)
    while os.path.exists(scanned.active.path):  # roll it before the plan checks its headers
        app.append(msgs(app.last + 1, app.last + 10))
    ranges = partition_ranges([scanned], Bounds(seq_ranges={("t", 0): (1, 100)}), True, 200)
    assert [(r.start, r.stop, r.error) for r in ranges] == [(0, None, None)]
    assert seqs_of(ranges) == list(range(1, 101))


def test_verify_of_a_partition_whose_broker_rolls_meanwhile_is_clean(tmp_path, monkeypatch):
    """`tank-log verify` runs while the broker serves (the maintenance window's last step): a roll of the active
    segment between the scan and the segment's check made verify report an [io] error for a file that had only
    been renamed; it now scans the partition again and finds it under its RO name."""
    from tank_log.maintenance import verify

    app = PartitionAppender(tmp_path / "t" / "0", segment_bytes=500)
    for lo in range(1, 100, 10):
        app.append(msgs(lo, lo + 9))
    check = verify.check_segment
    rolled = []

    def roll_first(seg, **kwargs):  # the broker appends and rolls just before this segment is read
        if seg.is_active and not rolled:
            while not rolled:
                app.append(msgs(app.next_seq, app.next_seq + 9))
                if not os.path.exists(seg.path):
                    rolled.append(seg.path)
        return check(seg, **kwargs)

    monkeypatch.setattr(verify, "check_segment", roll_first)
    assert verify.verify_path(str(tmp_path)) == []
    assert rolled
