"""Broker config grammar (docs/FORMAT.md §1.5)."""

import pytest

from tank_log.format.broker_config import PartitionConfig, load_config, parse_config, parse_duration, parse_size


@pytest.mark.parametrize(
    "text,value",
    [
        ("90", 90),
        ("1d", 86400),
        ("2h+30min", 9000),
        ("1w,1d", 691200),
        ("3days", 259200),
        ("1month", 31536000),
        ("10secs", 10),
        ("5min", 300),
    ],
)
def test_durations(text, value):
    assert parse_duration(text) == value


@pytest.mark.parametrize("text", ["5m", "1 d", "", "d", "1D", "5x", "1d+"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    "text,value",
    [
        ("64", 64),
        ("64kb", 65536),
        ("32k", 32768),
        ("1g", 1 << 30),
        ("1gb+512mb", 3 << 29),
        ("2gibabyte", 2 << 30),
        ("1tb", 1 << 40),
    ],
)
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["1GB", "1gigabyte", "1 kb", "kb", "-1"])
def test_bad_sizes(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_defaults_and_override_order():
    topic, problems = parse_config("log.segment.bytes=32kb\nLOG.CLEANUP.POLICY = Cleanup # compact\n")
    assert problems == []
    assert topic.segment_bytes == 32768 and topic.cleanup_policy == "cleanup"
    part, problems = parse_config("log.segment.bytes=4kb\nlog.segment.bytes=8kb", base=topic)
    assert part.segment_bytes == 8192 and part.cleanup_policy == "cleanup" and problems == []
    assert PartitionConfig().min_cleanable_ratio == 0.5


@pytest.mark.parametrize(
    "line",
    [
        "   # indented comment",
        "   ",
        "\r",
        "no_equals_sign",
        "log.retention.secs=",
        "retention.segments.count=1",
        "log.retention.bytes=100",
        "log.segment.bytes=32",
        "log.segment.bytes=4gb",
        "log.cleanup.policy=compact",
        "log.retention.secs=5m",
        "log.cleaner.min.cleanable.ratio=2",
        "log.cleaner.min.cleanable.ratio=abc",
        "log.index.interval.bytes=100",
        "flush.messages=12x",
        "k=" + "v" * 128,
    ],
)
def test_lines_the_broker_rejects(line):
    cfg, problems = parse_config("log.segment.bytes=64kb\n" + line + "\n")
    assert [p.severity for p in problems] == ["error"]
    assert problems[0].offset == 2  # line number
    assert cfg.segment_bytes == 65536  # valid lines still apply


def test_blank_lines_and_comments_are_fine():
    _, problems = parse_config("# header\n\nlog.retention.secs=1d\n\n")
    assert problems == []


def test_crlf_blank_line_is_rejected_but_crlf_values_are_fine():
    cfg, problems = parse_config("log.retention.secs=1d\r\n\r\n")
    assert cfg.retention_secs == 86400
    assert len(problems) == 1 and problems[0].offset == 2


def test_unknown_key_is_a_warning():
    _, problems = parse_config("log.flush.whatever=1\n")
    assert [p.severity for p in problems] == ["warning"]


def test_missing_file_is_default(tmp_path):
    cfg, problems = load_config(tmp_path / "config")
    assert cfg == PartitionConfig() and problems == []
