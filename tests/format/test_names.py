import pytest

from tank_log.errors import SegmentNameError
from tank_log.format.names import (
    CompactionTemp,
    FileName,
    Kind,
    format_active_name,
    format_index_name,
    format_ro_name,
    parse_name,
)


@pytest.mark.parametrize(
    "name,expected",
    [
        ("1-105_1795261032.ilog", FileName(1, Kind.RO, 105, 1795261032)),
        ("465-558.ilog", FileName(465, Kind.RO, 558, None)),
        ("647_1795261032.log", FileName(647, Kind.ACTIVE, None, 1795261032)),
        ("647.log", FileName(647, Kind.ACTIVE, None, None)),
        ("647.index", FileName(647, Kind.INDEX)),
        ("647_64.index", FileName(647, Kind.INDEX, wide=True)),
        ("5-5_0.ilog", FileName(5, Kind.RO, 5, 0)),
    ],
)
def test_parse(name, expected):
    assert parse_name(name) == expected
    assert expected.name == name


@pytest.mark.parametrize(
    "name,stage,inner",
    [
        ("93-20120_1795261069.ilog.cleaned", "cleaned", FileName(93, Kind.RO, 20120, 1795261069)),
        ("93.index.cleaned", "cleaned", FileName(93, Kind.INDEX)),
        ("1-5_7.ilog.swap", "swap", FileName(1, Kind.RO, 5, 7)),
        ("1.index.swap", "swap", FileName(1, Kind.INDEX)),
        ("1-5_7.ilog.old", "old", FileName(1, Kind.RO, 5, 7)),
        ("1.index.old", "old", FileName(1, Kind.INDEX)),
    ],
)
def test_compaction_temporaries(name, stage, inner):
    assert parse_name(name) == CompactionTemp(inner, stage)


def test_broker_placeholder_name_is_a_leftover():
    # the broker's first temp name `<base>-0_0.ilog.cleaned` has last < base: a leftover, never a segment
    assert parse_name("93-0_0.ilog.cleaned") == CompactionTemp(None, "cleaned")
    with pytest.raises(SegmentNameError):
        parse_name("93-0_0.ilog.swap")


@pytest.mark.parametrize("name", ["", ".hidden.ilog", "config", "README", "1-2_3.ilog.bak", "x.txt"])
def test_ignored(name):
    assert parse_name(name) is None


@pytest.mark.parametrize(
    "name",
    [
        "abc.ilog",
        "1-x_2.ilog",
        "007-010_1.ilog",
        "5-3_1.ilog",
        "0-3_1.ilog",
        "1-2_99999999999.ilog",
        "+1-2.ilog",
        "1_2_3.log",
        "1a.log",
        "0.log",
        "x.index",
        "01.index",
        "1-2_3 .ilog",
        "18446744073709551616-1.ilog",
    ],
)
def test_garbage_rejected(name):
    with pytest.raises(SegmentNameError):
        parse_name(name)


def test_format():
    assert format_ro_name(1, 5, 7) == "1-5_7.ilog"
    assert format_ro_name(1, 5, None) == "1-5.ilog"
    assert format_active_name(6, 9) == "6_9.log"
    assert format_index_name(6) == "6.index"
    with pytest.raises(ValueError):
        format_ro_name(5, 1, 0)
    with pytest.raises(ValueError):
        format_active_name(1, 2**32)
