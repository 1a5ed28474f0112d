"""The recorded versions of a Delta table read in one pass over its log (`lakehouse.delta.app_transactions`): equal
to delta-rs's `transaction_version` for every app id, on tables delta-rs and delta-spark wrote, at every version."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from pyarrow import fs

from tank_log.lakehouse.delta import TXN_RETENTION_KEY, app_transactions
from tank_log.lakehouse.table import TableUnreadable

LOCAL = fs.LocalFileSystem()


def _as_delta_rs_reads(uri: str, version: int | None, ids: set[str]) -> dict[str, int]:
    table = DeltaTable(uri, version=version)
    return {a: v for a in sorted(ids) if (v := table.transaction_version(a)) is not None}


def test_one_pass_equals_transaction_version_superseded_checkpointed_expired(tmp_path):
    """150 app ids, superseded over commits (every id, then every third, then every seventh), checkpoints every
    three commits, one id expired by the table's retention and one never dated: at each version the one pass holds
    what delta-rs returns id by id, and a pass over every id costs a fraction of delta-rs's calls."""
    uri = str(tmp_path / "t")
    now = int(time.time() * 1000)
    write_deltalake(
        uri, pa.table({"a": [0]}), configuration={"delta.checkpointInterval": "3", TXN_RETENTION_KEY: "interval 2 days"}
    )
    ids = {f"app-{i}" for i in range(150)}
    for round_, step in enumerate((1, 3, 7, 1, 3, 7, 5)):
        txns = [Transaction(f"app-{i}", 100 * round_ + i, last_updated=now) for i in range(0, 150, step)]
        if round_ == 2:
            txns += [Transaction("expired", 5, last_updated=now - 3 * 86_400_000), Transaction("undated", 6)]
        write_deltalake(
            uri, pa.table({"a": [round_]}), mode="append", commit_properties=CommitProperties(app_transactions=txns)
        )
    names = os.listdir(os.path.join(uri, "_delta_log"))
    assert sum(".checkpoint." in n for n in names) >= 2
    ids |= {"expired", "undated", "never"}
    for version in range(DeltaTable(uri).version() + 1):
        got = app_transactions(DeltaTable(uri, version=version), LOCAL, uri)
        assert got == _as_delta_rs_reads(uri, version, ids), version
    latest = DeltaTable(uri)
    got = app_transactions(latest, LOCAL, uri)
    assert "expired" not in got and got["undated"] == 6 and got["app-0"] == 600 and got["app-1"] == 301
    t0 = time.perf_counter()
    by_id = {a: latest.transaction_version(a) for a in sorted(ids)}
    per_id = time.perf_counter() - t0
    t0 = time.perf_counter()
    once = app_transactions(latest, LOCAL, uri)
    assert {a: once.get(a) for a in sorted(ids)} == by_id
    assert time.perf_counter() - t0 < per_id / 4  # one read, not one replay per id


def test_a_missing_commit_is_named(tmp_path):
    """A commit after the last checkpoint gone from the log: refused, naming the file, never read as no record."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"a": [0]}))
    for v in (1, 2):
        txn = CommitProperties(app_transactions=[Transaction("app", v)])
        write_deltalake(uri, pa.table({"a": [v]}), mode="append", commit_properties=txn)
    table = DeltaTable(uri)
    os.remove(os.path.join(uri, "_delta_log", f"{1:020d}.json"))
    with pytest.raises(TableUnreadable, match=r"00000000000000000001\.json is missing"):
        app_transactions(table, LOCAL, uri)


def _split_checkpoint(log: str, version: int, parts: int, keep: int) -> None:
    """Version `version`'s checkpoint as one of `parts` parts, as the protocol names them (delta-spark writes such
    past `checkpoint.partSize` actions), only the first `keep` of them left (fewer: a checkpoint cut short)."""
    single = os.path.join(log, f"{version:020d}.checkpoint.parquet")
    actions = pq.read_table(single)
    os.remove(single)
    step = -(-len(actions) // parts)
    for i in range(keep):
        pq.write_table(
            actions.slice(i * step, step),
            os.path.join(log, f"{version:020d}.checkpoint.{i + 1:010d}.{parts:010d}.parquet"),
        )


def test_multi_part_checkpoints_and_a_part_missing(tmp_path):
    """A checkpoint of three parts is read whole; one with a part missing is skipped for the one before it and the
    commits after that, as delta-rs skips it."""
    uri = str(tmp_path / "t")
    log = os.path.join(uri, "_delta_log")
    write_deltalake(uri, pa.table({"a": [0]}), configuration={"delta.checkpointInterval": "3"})
    for v in range(1, 7):
        txns = [Transaction(f"app-{i}", 10 * v + i) for i in range(0, 12, v)]
        write_deltalake(
            uri, pa.table({"a": [v]}), mode="append", commit_properties=CommitProperties(app_transactions=txns)
        )
    assert sorted(n for n in os.listdir(log) if ".checkpoint." in n) == [f"{v:020d}.checkpoint.parquet" for v in (2, 5)]
    os.remove(os.path.join(log, "_last_checkpoint"))
    _split_checkpoint(log, 2, 3, keep=3)
    _split_checkpoint(log, 5, 2, keep=1)
    ids = {f"app-{i}" for i in range(12)}
    for version in range(7):
        assert app_transactions(DeltaTable(uri, version=version), LOCAL, uri) == _as_delta_rs_reads(uri, version, ids)
    for v in (1, 2):  # the commits the checkpoint at 2 stands for, gone: it is read, not them
        os.remove(os.path.join(log, f"{v:020d}.json"))
    got = app_transactions(DeltaTable(uri), LOCAL, uri)
    assert got == _as_delta_rs_reads(uri, None, ids) and got["app-0"] == 60 and got["app-1"] == 11
