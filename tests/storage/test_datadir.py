"""Discovery as the broker scans (docs/FORMAT.md §1, §2.6), problems reported instead of ignored/aborting."""

import os

from conftest import data_dir

from tank_log.maintenance.verify import verify_path
from tank_log.storage.datadir import classify_path, partitions_at, scan_data_dir


def codes(problems):
    return sorted(p.code for p in problems)


def test_fixture_layout():
    dd = scan_data_dir(data_dir("C_misc"))
    assert [t.name for t in dd.topics] == ["bigmsg", "holes", "restarted", "timeroll"]
    holes = next(t for t in dd.topics if t.name == "holes")
    assert [len(p.segments) for p in holes.partitions] == [0, 1, 0]
    timeroll = next(t for t in dd.topics if t.name == "timeroll").partitions[0]
    assert [s.base for s in timeroll.ro] == [1] and timeroll.active.base == 51
    assert timeroll.config.roll_jitter_secs == 1


def test_ignored_and_reported_entries(tmp_path):
    base = tmp_path
    (base / ".stray").mkdir()
    (base / "notes.txt").write_text("x")
    t = base / "t"
    t.mkdir()
    (t / "0").mkdir()
    (t / "2").mkdir()  # {0, 2}: the broker serves 0 and 1, ignores 2
    (t / "0" / "readme").write_text("x")
    (t / "0" / "abc.ilog").write_text("x")
    (t / "0" / "7.index").write_bytes(b"")
    (t / "0" / "5_64.index").write_bytes(b"")
    (base / "empty").mkdir()
    dd = scan_data_dir(base)
    assert [x.name for x in dd.topics] == ["empty", "t"]
    assert codes(dd.problems) == ["stray-topic"]
    topic = next(x for x in dd.topics if x.name == "t")
    assert codes(topic.problems) == ["partition-ids"]
    assert [p.id for p in topic.partitions] == [0]
    assert codes(topic.partitions[0].problems) == ["bad-name", "unexpected-name", "wide-index"]
    assert "stale-index" in codes(verify_path(str(base)))


def test_digit_named_file_is_reported(tmp_path):
    t = tmp_path / "t"
    t.mkdir()
    (t / "0").write_text("not a dir")
    dd = scan_data_dir(tmp_path)
    assert "partition-not-dir" in codes(dd.topics[0].problems)


def test_classify_path():
    d = data_dir("A_multi")
    assert classify_path(d) == "base"
    assert classify_path(os.path.join(d, "events")) == "topic"
    assert classify_path(os.path.join(d, "events", "1")) == "partition"
    assert classify_path(os.path.join(d, "events", "1", "7377_1795261032.log")) == "segment"
    assert len(partitions_at(os.path.join(d, "events"))) == 3
    assert [p.topic for p in partitions_at(d, ["small", "retained"])] == ["retained", "small"]
