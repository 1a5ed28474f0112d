"""Torn tails (docs/FORMAT.md §3.11) are data, not crashes."""

import os

import pytest

from tank_log.errors import TankFormatError
from tank_log.maintenance.verify import check_segment
from tank_log.storage.datadir import partitions_at
from tank_log.storage.segment import Segment


def _active_copy(fixture_copy):
    base = fixture_copy("A_multi")
    part = next(p for p in partitions_at(base) if p.key == ("events", 2))
    return part.active


def test_truncated_active_segment_reports_a_tail(fixture_copy):
    sf = _active_copy(fixture_copy)
    full = list(Segment(sf.path).messages())
    bundles = list(Segment(sf.path).bundles())
    cut = bundles[-1].offset + 7  # in the middle of the last bundle
    with open(sf.path, "r+b") as fh:
        fh.truncate(cut)
    walk = Segment(sf.path).messages()
    got = list(walk)
    assert got == full[: len(got)]
    assert len(got) == len(full) - bundles[-1].count  # every complete bundle kept
    assert walk.tail.valid_end == bundles[-1].offset
    assert walk.tail.torn_bytes == 7
    problems = check_segment(sf.path).problems
    assert [p.code for p in problems] == ["torn-tail"]
    assert problems[0].offset == bundles[-1].offset


@pytest.mark.parametrize("garbage", [b"\x00" * 37, b"\xff\xff", b"\x85"])
def test_trailing_zero_bytes_and_cut_varints_are_tails(fixture_copy, garbage):
    sf = _active_copy(fixture_copy)
    size = os.path.getsize(sf.path)
    with open(sf.path, "ab") as fh:
        fh.write(garbage)
    walk = Segment(sf.path).messages()
    list(walk)
    assert walk.tail.valid_end == size and walk.tail.torn_bytes == len(garbage)


def test_zero_length_bundle_mid_file_is_an_error(fixture_copy):
    sf = _active_copy(fixture_copy)
    first = next(Segment(sf.path).bundles())
    with open(sf.path, "r+b") as fh:
        fh.seek(first.end)
        fh.write(b"\x00")
    with pytest.raises(TankFormatError) as e:
        list(Segment(sf.path).messages())
    assert e.value.path == sf.path and e.value.offset == first.end
