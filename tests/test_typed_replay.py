"""Replaying dead letters after a schema fix (`--replay-dead-letters`, tank_spark/export/dead_letters.py): values
whose schema id the config did not know go to the dead-letter table; once the id is configured, a replay appends
them to the table and removes them from the dead-letter table, in Delta and Iceberg tables; a replay killed between
its commit and the removal, then rerun, leaves every message in exactly one table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest
from conftest import ROOT, wait_for_hold
from test_typed_export import SMALL, VALUES, avro, config, export, framed, rows, write_topic

SMALL_V2 = os.path.join(VALUES, "small_v2.avsc")  # a field added, `ms` widened, `user` renamed by an alias


def values() -> list[bytes]:
    """Seqs 1-6: odd ones with schema id 1, even ones with id 2 (unknown until the fix)."""
    return [framed(1 if i % 2 == 0 else 2, avro(SMALL, {"user": i, "page": f"/p{i}", "ms": i})) for i in range(6)]


def setup(tmp_path, fmt: str) -> tuple[list[str], list[str]]:
    """Export with id 2 unknown (seqs 2, 4, 6 dead-lettered); the args of the export before and after the fix."""
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    write_topic(base, "clicks", {0: values()})
    common = ["--data-dir", base, "--table", table, "--format", fmt]
    section = {"value_format": "avro", "value_schema_file": SMALL, "value_wire": "confluent"}
    before = config(tmp_path, **section, value_schema_ids={1: SMALL})
    os.rename(before, tmp_path / "before.yaml")
    fixed = config(tmp_path, **section, value_schema_ids={1: SMALL, 2: SMALL})
    assert export(*common, "--config", str(tmp_path / "before.yaml")) == 0
    assert rows(table, "seq", fmt) == [(1,), (3,), (5,)]
    assert rows(table + "_dead_letters", "seq", fmt) == [(2,), (4,), (6,)]
    return common, ["--config", fixed]


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_replay_after_the_fix_moves_the_dead_letters_into_the_table(tmp_path, fmt):
    common, fixed = setup(tmp_path, fmt)
    table = common[3]
    report = str(tmp_path / "r.json")
    assert export(*common, *fixed, "--replay-dead-letters", "--dry-run", "--report", report) == 0
    summary = json.load(open(report))["summary"]  # a dry run counts and writes nothing
    assert (summary["dry_run"], summary["replayed"], summary["still_bad"], summary["settled"]) == (True, 3, 0, 0)
    assert rows(table, "seq", fmt) == [(1,), (3,), (5,)]
    assert rows(table + "_dead_letters", "seq", fmt) == [(2,), (4,), (6,)]
    assert export(*common, *fixed, "--replay-dead-letters", "--report", report) == 0
    summary = json.load(open(report))["summary"]
    assert (summary["replayed"], summary["still_bad"], summary["settled"]) == (3, 0, 0)
    assert rows(table, "seq,user", fmt) == [(s, s - 1) for s in range(1, 7)]
    assert rows(table + "_dead_letters", "seq", fmt) == []
    assert export(*common, *fixed, "--replay-dead-letters") == 0  # nothing left: nothing twice
    assert rows(table, "seq", fmt) == [(s,) for s in range(1, 7)]


def test_a_replay_killed_between_its_commit_and_the_removal(tmp_path):
    common, fixed = setup(tmp_path, "delta")
    table = common[3]
    hold = str(tmp_path / "release")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", TANK_LOG_REPLAY_HOLD=hold)
    job = [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[1]"]
    proc = subprocess.Popen(
        [*job, *common, *fixed, "--replay-dead-letters"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_hold(hold + ".ready", proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert rows(table, "seq") == [(s,) for s in range(1, 7)]  # appended...
    assert rows(table + "_dead_letters", "seq") == [(2,), (4,), (6,)]  # ...and not yet removed
    report = str(tmp_path / "r.json")
    assert export(*common, *fixed, "--replay-dead-letters", "--report", report) == 0
    summary = json.load(open(report))["summary"]
    assert (summary["replayed"], summary["settled"]) == (0, 3)
    assert rows(table, "seq") == [(s,) for s in range(1, 7)]
    assert rows(table + "_dead_letters", "seq") == []


def test_a_replay_decodes_the_keys_too(tmp_path):
    """A key whose schema id the config did not know dead-letters its record; once the id is configured
    (`export.key_schema_ids`), the replay decodes key and value into the table."""
    from test_typed_export import TS, click

    from tank_log.format.bundle import Message
    from tank_log.storage.writer import write_segment

    key_schema = tmp_path / "key.avsc"
    key_schema.write_text(json.dumps({"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"}]}))
    keys = [framed(2 if i == 3 else 1, avro(str(key_schema), {"id": i})) for i in range(5)]
    base, table = str(tmp_path / "data"), str(tmp_path / "t")
    os.makedirs(os.path.join(base, "clicks", "0"))
    msgs = [Message(i + 1, TS + i, k, avro(SMALL, click(i))) for i, k in enumerate(keys)]
    write_segment(os.path.join(base, "clicks", "0"), msgs, active=True, ts=TS // 1000)
    section = {"value_format": "avro", "value_schema_file": SMALL, "key_format": "avro", "key_wire": "confluent"}
    before = config(tmp_path, **section, key_schema_ids={1: str(key_schema)})
    os.rename(before, tmp_path / "before.yaml")
    fixed = config(tmp_path, **section, key_schema_ids={1: str(key_schema), 2: str(key_schema)})
    common = ["--data-dir", base, "--table", table]
    assert export(*common, "--config", str(tmp_path / "before.yaml")) == 0
    ((seq, error),) = rows(table + "_dead_letters", "seq,error")
    assert seq == 4 and error.startswith("key: bytes 1-4: schema id 2"), error
    assert export(*common, "--config", fixed, "--replay-dead-letters") == 0
    assert rows(table, "seq,key,user") == [(s, {"id": s - 1}, s - 1) for s in range(1, 6)]
    assert rows(table + "_dead_letters", "seq") == []


def test_a_dry_run_replay_leaves_the_tables_schema_as_it_is(tmp_path):
    """A replay with a newer reader schema (a field added, a column widened) evolves the table when it runs; its
    dry run decodes and counts, and leaves the table's schema (as its rows) as they were."""
    from tank_log.lakehouse import TableLocation

    def columns(table: str) -> pa.Schema:
        return TableLocation.of(table, {}, "iceberg").existing().arrow_schema()

    common, _ = setup(tmp_path, "iceberg")
    table = common[3]
    section = {"value_format": "avro", "value_schema_file": SMALL_V2, "value_wire": "confluent"}
    newer = config(tmp_path, **section, value_schema_ids={1: SMALL, 2: SMALL})
    before = columns(table)
    report = str(tmp_path / "r.json")
    assert export(*common, "--config", newer, "--replay-dead-letters", "--dry-run", "--report", report) == 0
    summary = json.load(open(report))["summary"]
    assert (summary["dry_run"], summary["replayed"], summary["still_bad"]) == (True, 3, 0)
    assert columns(table) == before
    assert rows(table, "seq", "iceberg") == [(1,), (3,), (5,)]
