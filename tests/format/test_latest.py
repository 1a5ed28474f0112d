"""The latest message per key of Arrow rows (tank_log.format.latest): compaction's rule, in bulk and in steps."""

import pyarrow as pa

from tank_log.format.latest import TOMBSTONE, latest_per_key


def rows(items):
    """(topic, partition, seq, key, value) tuples → a table."""
    t, p, s, k, v = zip(*items, strict=True)
    return pa.table(
        {
            "topic": pa.array(t, pa.string()),
            "partition": pa.array(p, pa.int32()),
            "seq": pa.array(s, pa.int64()),
            "key": pa.array(k, pa.binary()),
            "value": pa.array(v, pa.binary()),
        }
    )


MESSAGES = [
    ("a", 0, 1, b"k", b"1"),
    ("a", 0, 2, b"j", b"2"),
    ("a", 1, 3, b"k", b"3"),  # another partition: another key
    ("a", 0, 4, None, b"4"),  # keyless
    ("b", 0, 5, b"k", b""),  # a tombstone
    ("a", 0, 7, b"k", b""),  # k's latest in a/0 is a tombstone ...
    ("a", 0, 6, b"k", b"6"),  # ... whatever the rows' order
    ("a", 0, 8, None, b""),
]


def test_the_highest_seq_of_each_key_wins_and_tombstones_are_marked():
    got = latest_per_key(rows(MESSAGES), ["topic", "partition"])
    assert got.keyless == 2
    assert sorted((r["topic"], r["partition"], r["key"], r["seq"], r[TOMBSTONE]) for r in got.rows.to_pylist()) == [
        ("a", 0, b"j", 2, False),
        ("a", 0, b"k", 7, True),
        ("a", 1, b"k", 3, False),
        ("b", 0, b"k", 5, True),
    ]


def test_reducing_in_steps_gives_one_reduction():
    one = latest_per_key(rows(MESSAGES), ["topic", "partition"]).rows
    parts = [latest_per_key(rows(MESSAGES[i : i + 3]), ["topic", "partition"]).rows for i in range(0, 8, 3)]
    steps = latest_per_key(pa.concat_tables(parts), ["topic", "partition"]).rows
    assert steps.sort_by("seq").to_pylist() == one.sort_by("seq").to_pylist()
    assert latest_per_key(rows(MESSAGES[:0] + [MESSAGES[3]])).rows.num_rows == 0
