"""Topic and partition `config` files with the broker's grammar, units and defaults (docs/FORMAT.md §1.5).

`parse_config` never raises for content: every line the broker would reject (startup abort) or misread is a
Problem; valid lines apply on top of the given base configuration (topic level first, then partition level).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from typing import Any

from tank_log.format.varint import U32_MAX
from tank_log.problems import Problem

DURATION_UNITS = {  # §1.5 parse_duration; "month" is a year in the broker (bug), kept for fidelity
    "weeks": 604800,
    "week": 604800,
    "w": 604800,
    "years": 31536000,
    "year": 31536000,
    "y": 31536000,
    "months": 31536000,
    "month": 31536000,
    "mon": 31536000,
    "days": 86400,
    "day": 86400,
    "d": 86400,
    "hours": 3600,
    "hour": 3600,
    "h": 3600,
    "minutes": 60,
    "minute": 60,
    "mins": 60,
    "min": 60,
    "seconds": 1,
    "second": 1,
    "secs": 1,
    "sec": 1,
    "s": 1,
}
SIZE_UNITS = {  # §1.5 parse_size; "gigabyte" (singular) is not accepted by the broker (typo "gibabyte")
    "terabytes": 1 << 40,
    "terabyte": 1 << 40,
    "tbs": 1 << 40,
    "tb": 1 << 40,
    "t": 1 << 40,
    "gigabytes": 1 << 30,
    "gibabyte": 1 << 30,
    "gbs": 1 << 30,
    "gb": 1 << 30,
    "g": 1 << 30,
    "megabytes": 1 << 20,
    "megabyte": 1 << 20,
    "mbs": 1 << 20,
    "mb": 1 << 20,
    "m": 1 << 20,
    "kilobytes": 1 << 10,
    "kilobyte": 1 << 10,
    "kbs": 1 << 10,
    "kb": 1 << 10,
    "k": 1 << 10,
    "bytes": 1,
    "byte": 1,
    "b": 1,
}


def _parse_terms(text: str, units: dict[str, int], what: str) -> int:
    """`<digits><unit?>` terms, optionally separated by `,` or `+`, no spaces; longest unit first."""
    names = sorted(units, key=len, reverse=True)
    pos, total = 0, 0
    if not text:
        raise ValueError(f"empty {what}")
    while pos < len(text):
        m = re.match(r"[0-9]+", text[pos:])
        if not m:
            raise ValueError(f"bad {what} {text!r} at character {pos}")
        number = int(m[0])
        pos += len(m[0])
        mult = 1
        for unit in names:
            if text.startswith(unit, pos):
                mult = units[unit]
                pos += len(unit)
                break
        total += number * mult
        if pos < len(text):
            if text[pos] in ",+" and pos + 1 < len(text):
                pos += 1
            elif not text[pos].isdigit():
                raise ValueError(f"bad {what} {text!r} at character {pos}")
    return total


def parse_duration(text: str) -> int:
    """Seconds (§1.5 duration grammar: `1d`, `2h+30min`, `90`; `5m` is an error).

    Raises:
        ValueError: not in the broker's duration grammar (§1.5).
    """
    value = _parse_terms(text, DURATION_UNITS, "duration")
    if value > U32_MAX:
        raise ValueError(f"duration {text!r} overflows the broker's u32 seconds")
    return value


def parse_size(text: str) -> int:
    """Bytes (§1.5 size grammar, lower-case units: `64kb`, `1g`, `1gb+512mb`; `1GB` is an error)."""
    return _parse_terms(text, SIZE_UNITS, "size")


@dataclass(frozen=True)
class PartitionConfig:
    """Effective configuration of a partition (defaults = the broker's `partition_config` initialisers)."""

    retention_segments_count: int = 0  # retention.segments.count, 0 = unlimited
    retention_bytes: int = 0  # log.retention.bytes, 0 = unlimited
    retention_secs: int = 0  # log.retention.secs, 0 = disabled
    cleanup_policy: str = "delete"  # log.cleanup.policy: delete | cleanup
    min_cleanable_ratio: float = 0.5  # log.cleaner.min.cleanable.ratio
    segment_bytes: int = 1 << 30  # log.segment.bytes
    index_interval_bytes: int = 4096  # log.index.interval.bytes
    index_size_max_bytes: int = 10 << 20  # log.index.size.max.bytes
    roll_jitter_secs: int = 0  # log.roll.jitter.secs
    roll_secs: int = 604800  # log.roll.secs (parsed but unused by the broker)
    flush_messages: int = 0  # flush.messages
    flush_secs: int = 0  # flush.secs


def broker_deletes(config: PartitionConfig) -> list[str]:
    """The keys (`key=value`) with which the broker itself deletes RO segments at its next roll (§5): with
    `log.cleanup.policy=delete`, a non-zero `log.retention.secs`, `log.retention.bytes` or
    `retention.segments.count`. Empty when the broker deletes nothing by itself."""
    if config.cleanup_policy != "delete":
        return []
    keys = (
        ("log.retention.secs", config.retention_secs),
        ("log.retention.bytes", config.retention_bytes),
        ("retention.segments.count", config.retention_segments_count),
    )
    return [f"{key}={value}" for key, value in keys if value]


def _uint32(value: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{value!r} is not a decimal number (the broker's AsUint32 would read garbage)")
    if len(value) > 10 or int(value) > U32_MAX:
        raise ValueError(f"{value!r} does not fit u32 (the broker reads 0)")
    return int(value)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _segments_count(v: str) -> int:
    n = _uint32(v)
    _check(n == 0 or n >= 2, "must be 0 or >= 2")
    return n


def _retention_bytes(v: str) -> int:
    n = parse_size(v)
    _check(n == 0 or n >= 128, "must be 0 or >= 128")
    return n


def _segment_bytes(v: str) -> int:
    n = parse_size(v)
    _check(n >= 64, "must be >= 64")
    _check(n < 1 << 32, "must stay below 4 GiB (segment sizes are u32, §8)")
    return n


def _min128(v: str) -> int:
    n = parse_size(v)
    _check(n >= 128, "must be >= 128")
    return n


def _policy(v: str) -> str:
    low = v.lower()
    _check(low in ("delete", "cleanup"), "must be delete or cleanup")
    return low


def _ratio(v: str) -> float:
    try:
        r = float(v)
    except ValueError:
        raise ValueError("not a number: the broker reads NaN, which disables compaction") from None
    _check(not math.isnan(r), "NaN disables compaction")
    _check(0 <= r <= 1, "must be within [0, 1]")
    return r


KEYS = {
    "retention.segments.count": ("retention_segments_count", _segments_count),
    "log.retention.bytes": ("retention_bytes", _retention_bytes),
    "log.retention.secs": ("retention_secs", parse_duration),
    "log.cleanup.policy": ("cleanup_policy", _policy),
    "log.cleaner.min.cleanable.ratio": ("min_cleanable_ratio", _ratio),
    "log.segment.bytes": ("segment_bytes", _segment_bytes),
    "log.index.interval.bytes": ("index_interval_bytes", _min128),
    "log.index.size.max.bytes": ("index_size_max_bytes", _min128),
    "log.roll.jitter.secs": ("roll_jitter_secs", parse_duration),
    "log.roll.secs": ("roll_secs", parse_duration),
    "flush.messages": ("flush_messages", _uint32),
    "flush.secs": ("flush_secs", parse_duration),
}


def parse_config(
    text: str, path: str = "config", base: PartitionConfig | None = None
) -> tuple[PartitionConfig, list[Problem]]:
    """Apply a config file's lines on top of `base`; return the result and the problems found.

    Broker rules: split on `\\n`; a `#` starts a comment; a line is skipped only if *exactly* empty after removing
    the comment (so whitespace-only, indented-comment and CRLF-blank lines abort the broker); `key = value` split at
    the first `=`, both trimmed; value 1..127 bytes; keys case-insensitive; unknown keys ignored; later lines win.
    """
    config = base or PartitionConfig()
    problems: list[Problem] = []
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.split("#", 1)[0]
        if line == "":
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not 1 <= len(value.encode()) <= 127:
            why = "no '=' on the line" if not eq else "value must be 1..127 bytes"
            if not line.strip():
                why = "whitespace-only, indented-comment or CRLF-blank line"
            problems.append(Problem(path, lineno, "config-line", f"{why}: the broker aborts startup (line {raw!r})"))
            continue
        spec = KEYS.get(key.lower())
        if spec is None:
            problems.append(
                Problem(path, lineno, "config-unknown-key", f"unknown key {key!r} (the broker ignores it)", "warning")
            )
            continue
        field, parser = spec
        try:
            parsed: dict[str, Any] = {field: parser(value)}
            config = replace(config, **parsed)
        except ValueError as err:
            problems.append(Problem(path, lineno, "config-value", f"{key} = {value!r}: {err}"))
    return config, problems


def load_config(
    path: str | os.PathLike[str], base: PartitionConfig | None = None
) -> tuple[PartitionConfig, list[Problem]]:
    """Read a config file (missing file = `base` unchanged)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8", errors="surrogateescape")
    except FileNotFoundError:
        return base or PartitionConfig(), []
    return parse_config(text, path, base)
