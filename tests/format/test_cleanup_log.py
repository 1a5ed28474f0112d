import os

import pytest
from conftest import data_dir
from hypothesis import given
from hypothesis import strategies as st

from tank_log.errors import CleanupLogError
from tank_log.format.cleanup_log import CleanupRecord, encode_cleanup_log, parse_cleanup_log
from tank_log.storage.cleanup_marks import read_cleanup_log, update_cleanup_log, write_cleanup_log


def test_observed_example():
    # docs/FORMAT.md §1.6: topic kv, partition 0, seq 30
    raw = bytes.fromhex("026b7600001e00000000000000")
    assert parse_cleanup_log(raw) == [CleanupRecord("kv", 0, 30)]
    assert encode_cleanup_log([CleanupRecord("kv", 0, 30)]) == raw


def test_fixtures():
    assert read_cleanup_log(data_dir("B2_compaction_live")) == {("kvlive", 0): 7887, ("kvlive", 1): 4959}
    assert read_cleanup_log(data_dir("E_after")) == {("kv", 0): 8810}
    assert read_cleanup_log(data_dir("A_multi")) == {}


@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=60).filter(lambda t: len(t.encode()) <= 255),
            st.integers(0, 0xFFFE),
            st.integers(0, 2**64 - 1),
        )
    )
)
def test_round_trip(records):
    recs = [CleanupRecord(*r) for r in records]
    assert parse_cleanup_log(encode_cleanup_log(recs)) == recs


def test_truncated_is_an_error():
    raw = encode_cleanup_log([CleanupRecord("kv", 0, 30), CleanupRecord("other", 1, 5)])
    with pytest.raises(CleanupLogError) as e:
        parse_cleanup_log(raw[:-3], "x")
    assert e.value.offset == 13


def test_last_wins_and_zero_skipped(tmp_path):
    raw = encode_cleanup_log([CleanupRecord("a", 0, 5), CleanupRecord("a", 0, 9), CleanupRecord("b", 0, 0)])
    (tmp_path / ".cleanup.log").write_bytes(raw)
    assert read_cleanup_log(tmp_path) == {("a", 0): 9}


def test_atomic_update_leaves_no_temp(tmp_path):
    write_cleanup_log(tmp_path, {("a", 0): 5, ("b", 1): 7})
    update_cleanup_log(tmp_path, {("a", 0): None, ("c", 2): 3})
    assert read_cleanup_log(tmp_path) == {("b", 1): 7, ("c", 2): 3}
    assert sorted(os.listdir(tmp_path)) == [".cleanup.log"]  # no temporary, and no lock file after the rewrite
