"""SegmentWriter.add_columns and OutputSegments.add_columns (compaction's survivors): the same bundles, segments and
bytes as adding the messages one by one, on both codec cores (TANK_FORMAT.md §3.3–§3.6, §4.6)."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tank_log.format import native
from tank_log.format.bundle import Message, SnappyPolicy
from tank_log.format.index import REL_SEQ_LIMIT
from tank_log.format.messages import MessageColumns
from tank_log.format.varint import U32_MAX
from tank_log.maintenance.compaction.options import CompactionOptions
from tank_log.maintenance.compaction.output import OutputSegments
from tank_log.storage.partition_writer import PartitionWriter, write_partition
from tank_log.storage.writer import BundlePolicy, SegmentWriter


def columns(messages: list[Message]) -> MessageColumns:
    """Columns over one buffer, with unrelated bytes between the fields (as in a decoded message set)."""
    data, ko, kl, vo, vl = bytearray(b"#"), [], [], [], []
    for m in messages:
        if m.key is None:
            ko.append(-1)
            kl.append(0)
        else:
            ko.append(len(data))
            kl.append(len(m.key))
            data += m.key + b"|"
        vo.append(len(data))
        vl.append(len(m.value))
        data += m.value + b"|"
    i64 = np.int64
    return MessageColumns(
        np.array([m.seq for m in messages], np.uint64),
        np.array([m.ts for m in messages], np.uint64),
        np.array(ko, i64),
        np.array(kl, i64),
        np.array(vo, i64),
        np.array(vl, i64),
        np.zeros(len(messages), i64),
        bytes(data),
    )


@st.composite
def message_runs(draw):
    """Increasing seqs with small gaps, gaps past a sparse span (2**32) and past an index's reach (2**31)."""
    n = draw(st.integers(1, 60))
    seq, ts, out = draw(st.integers(1, 5)), 1_700_000_000_000, []
    for _ in range(n):
        out.append(
            Message(
                seq,
                ts,
                draw(st.sampled_from([None, b"", b"k1", b"key-2", b"x" * 255])),
                draw(st.sampled_from([b"", b"v", b"value " * 30, bytes(range(256)) * 8])),
            )
        )
        seq += draw(st.sampled_from([1, 1, 1, 2, 7, U32_MAX + 2, REL_SEQ_LIMIT]))
        ts += draw(st.sampled_from([0, 0, 1, 1000]))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
    return out, cuts


def files(directory) -> dict[str, bytes]:
    return {f: open(os.path.join(directory, f), "rb").read() for f in sorted(os.listdir(directory))}


policies = st.builds(
    BundlePolicy,
    st.sampled_from([1, 3, 16, 100]),
    st.sampled_from([40, 1000, 64 << 10]),
    st.sampled_from(list(SnappyPolicy)),
)


def bulk_and_one_by_one(tmp_path_factory, messages, cuts, policy, by_message) -> list[dict[str, bytes]]:
    """Output files of the messages added one by one, and in runs cut at `cuts` (by `add` where `by_message`)."""
    dirs = []
    for bulk in (False, True):
        d = tmp_path_factory.mktemp("bulk" if bulk else "one")
        out = OutputSegments(str(d), CompactionOptions(policy=policy), segment_bytes=300, index_interval=100)
        out.input_ts = 1_700_000_000
        bounds = [0, *cuts, len(messages)]
        for part, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
            if bulk and not by_message[part]:
                out.add_columns(columns(messages[lo:hi]))
            else:
                for m in messages[lo:hi]:
                    out.add(m)
        out.close_current()
        for w in out.done:
            os.rename(w.log_path, os.path.join(d, w.log_name))
            os.rename(w.index_path, os.path.join(d, w.index_name))
        dirs.append(files(d))
    return dirs


cores = pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure"])


@cores
@settings(max_examples=60, deadline=None)
@given(run=message_runs(), policy=policies, by_message=st.lists(st.booleans(), min_size=5, max_size=5))
def test_output_segments_in_bulk_equal_one_by_one(tmp_path_factory, pure, run, policy, by_message):
    """Runs alternate between `add` per message and `add_columns`; segments roll by size and by index reach."""
    if not pure and not native.compiled():
        pytest.skip("compiled core not built")
    with native.use_pure(pure):
        one, bulk = bulk_and_one_by_one(tmp_path_factory, *run, policy, by_message)
    assert one == bulk and one


def test_add_columns_stops_past_the_size_and_before_the_index_reach(tmp_path):
    msgs = [Message(s, 5, b"k", b"v" * 50) for s in range(1, 41)] + [Message(40 + REL_SEQ_LIMIT, 5, None, b"far")]
    w = SegmentWriter(tmp_path, policy=BundlePolicy(max_messages=10))
    cols = columns(msgs)
    taken = w.add_columns(cols, stop_past_size=100)
    assert taken == 10 and w.bundles == 1 and w.size > 100
    assert w.add_columns(cols.slice(taken, len(cols))) == 30  # the last seq is beyond the index's reach
    assert w.messages == 40 and w.last == 40
    w.abort()


def test_add_columns_rejects_what_add_rejects(tmp_path):
    w = SegmentWriter(tmp_path)
    w.add(Message(5, 0, None, b"a"))
    with pytest.raises(ValueError, match="must increase"):
        w.add_columns(columns([Message(5, 0, None, b"b")]))
    with pytest.raises(ValueError, match="must increase"):
        w.add_columns(columns([Message(7, 0, None, b"b"), Message(7, 0, None, b"c")]))
    with pytest.raises(ValueError, match="255"):
        w.add_columns(columns([Message(9, 0, b"k" * 256, b"b")]))
    w.abort()


@st.composite
def partition_runs(draw):
    """Increasing seqs with small gaps (rolls happen only where the counter continues), cut into runs."""
    n = draw(st.integers(1, 80))
    seq, ts, out = draw(st.integers(1, 5)), 1_700_000_000_000, []
    for _ in range(n):
        out.append(Message(seq, ts, draw(st.sampled_from([None, b"k1", b"key-2"])), draw(st.sampled_from(VALUES))))
        seq += draw(st.sampled_from([1, 1, 1, 2, 7, 1000]))
        ts += draw(st.sampled_from([0, 1, 1000, 5_000_000]))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
    return out, cuts


VALUES = [b"", b"v", b"value " * 30, bytes(range(256)) * 2]


def written(d, make) -> tuple[str, dict[str, bytes]]:
    try:
        make(str(d))
    except ValueError as err:
        return f"refused: {err}", files(d)
    return "ok", files(d)


@cores
@settings(max_examples=60, deadline=None)
@given(
    run=partition_runs(),
    policy=policies,
    by_message=st.lists(st.booleans(), min_size=5, max_size=5),
    segment_bytes=st.sampled_from([1, 200, 700, 1 << 20]),
    with_active=st.booleans(),
    first_segment_ro=st.booleans(),
)
def test_partition_writer_in_bulk_equals_write_partition(
    tmp_path_factory, pure, run, policy, by_message, segment_bytes, with_active, first_segment_ro
):
    """PartitionWriter with runs alternating between `add` and `add_columns` writes exactly what `write_partition`
    writes one message at a time: the same segments, names, indexes and bytes, or the same refusal."""
    if not pure and not native.compiled():
        pytest.skip("compiled core not built")
    messages, cuts = run
    opts = dict(segment_bytes=segment_bytes, with_active=with_active, policy=policy, first_segment_ro=first_segment_ro)

    def bulk(d):
        w = PartitionWriter(d, **opts)
        bounds = [0, *cuts, len(messages)]
        try:
            for part, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
                if by_message[part]:
                    for m in messages[lo:hi]:
                        w.add(m)
                elif hi > lo:
                    w.add_columns(columns(messages[lo:hi]))
            w.finish()
        except BaseException:
            w.abort()
            raise

    with native.use_pure(pure):
        one = written(tmp_path_factory.mktemp("one"), lambda d: write_partition(d, messages, **opts))
        many = written(tmp_path_factory.mktemp("bulk"), bulk)
    assert one == many
    assert one[0] == "ok" or "no two consecutive seqs" in one[0]
