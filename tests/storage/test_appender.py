"""The live appender writes what the broker's produce path writes (TANK_FORMAT.md §2.3–§2.5, §4.3)."""

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
