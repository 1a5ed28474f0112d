"""A table's history is checked, not trusted, and a table knows whose data it holds.

After a Delta RESTORE (delta-rs's and delta-spark's own) or an Iceberg rollback (pyiceberg's), the rows of the
undone commits are gone but the versions they recorded are not: the export, retention's guard and stats read what the
table still holds, the export says what went missing and exports it again. Messages deleted before they were exported
are named (status data-loss, exit 1). Two brokers' same-named partitions are two sources of one table; a table
written before sources belongs to the first source that exports into it."""

import json
import os

import pytest
from test_lakehouse_guard import _logs, _retention, _ro, _roll

from tank_log.lakehouse import LEGACY_SOURCE_KEY, ExportedSeqs, TableLocation, app_id, default_source

pytestmark = pytest.mark.spark


def export(tmp_path, name, *argv):
    """The export job in this process, in the driver (these partitions are small): (exit code, report)."""
    from tank_spark.export.job import main

    report = tmp_path / f"{name}.json"
    code = main(["--master", "local[1]", "--report", str(report), *argv])
    return code, json.loads(report.read_text())


def seqs_of(uri, fmt="delta", source=None):
    """(source, topic, partition, seq) of every row the table holds, sorted (duplicates kept)."""
    table = TableLocation.of(uri, fmt=fmt).existing()
    rows = table.to_pyarrow_dataset().to_table().to_pylist()
    return sorted(
        ((r.get("source"), r["topic"], r["partition"], r["seq"]) for r in rows), key=lambda r: (r[0] or "", *r[1:])
    )


def only_seqs(uri, fmt="delta"):
    return [s for _, _, _, s in seqs_of(uri, fmt)]


def _iceberg_rollback(uri, sequence_number):
    """pyiceberg's own rollback: the current snapshot set back to the one with this sequence number."""
    table = TableLocation.of(uri, fmt="iceberg").existing().table
    (target,) = [s for s in table.snapshots() if s.sequence_number == sequence_number]
    table.manage_snapshots().rollback_to_snapshot(target.snapshot_id).commit()


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_restored_table_is_exported_again_and_the_guard_keeps_what_it_lost(tmp_path, fmt):
    """1..40 exported, then 41..80; the table is taken back to the first export (delta-rs RESTORE, pyiceberg
    rollback): the guard says 40 (retention keeps 41..), the export names the undone commit and exports 41..80 again,
    each row once; the next run is up to date."""
    base = str(tmp_path / "base")
    uri = str(tmp_path / "table")
    flags = ["--data-dir", base, "--table", uri, "--format", fmt]
    pdir = _logs(base, [(1, 10), (11, 10), (21, 10)], 31)
    assert export(tmp_path, "first", *flags)[0] == 0
    _roll(pdir, [41, 51, 61], 71)
    assert export(tmp_path, "second", *flags)[0] == 0
    assert only_seqs(uri, fmt) == list(range(1, 81))

    if fmt == "delta":
        from deltalake import DeltaTable

        DeltaTable(uri).restore(1)  # version 0: the table made, 1: the first export's commit
    else:
        _iceberg_rollback(uri, 1)
    assert only_seqs(uri, fmt) == list(range(1, 41))

    recorded = ExportedSeqs(uri, fmt=fmt).recorded("logs", 0)
    assert (recorded.version, recorded.recorded) == (40, 80)
    from tank_log.tools.stats import stats_path

    (stats,) = stats_path(base, None, exported=ExportedSeqs(uri, fmt=fmt))
    assert stats.export_lag_messages == 40  # 41..80: stats measures the lag behind what the table holds
    assert ("RESTORE at table version 3" if fmt == "delta" else "rollback") in recorded.undone

    # retention's guard keeps what the table lost: the limit (2 RO segments) wants 1..50 gone
    r, rep = _retention(base, tmp_path, "guarded", "--keep-unexported", uri, *(["--format", fmt] * 0))
    if fmt == "delta":
        assert r.returncode == 0, r.stderr[-3000:]
        (p,) = rep["partitions"]
        assert p["exported_last"] == 40 and [d["base"] for d in p["deleted"]] == [1, 11, 21, 31]
        assert _ro(pdir)[0] == (41, 50)
        assert "records seq 80" in r.stderr and "holds seqs up to 40" in r.stderr

    code, rep = export(tmp_path, "again", *flags)
    assert code == 0
    (p,) = rep["partitions"]
    assert p["status"] == "exported" and (p["previous_version"], p["recorded_version"]) == (40, 80)
    assert (p["from_seq"], p["to_seq"], p["rows"]) == (41, 80, 40) and p["undone"] == recorded.undone
    assert only_seqs(uri, fmt) == list(range(1, 81))  # each once
    code, rep = export(tmp_path, "then", *flags)
    assert code == 0 and rep["partitions"][0]["status"] == "up-to-date"
    assert "undone" not in rep["partitions"][0]
    assert ExportedSeqs(uri, fmt=fmt).recorded("logs", 0).undone is None


def test_iceberg_guard_after_a_rollback(tmp_path):
    """Retention's guard on an Iceberg table rolled back to before its second export keeps 41.. ."""
    base = str(tmp_path / "base")
    uri = str(tmp_path / "table")
    pdir = _logs(base, [(1, 10), (11, 10), (21, 10)], 31)
    flags = ["--data-dir", base, "--table", uri, "--format", "iceberg"]
    assert export(tmp_path, "first", *flags)[0] == 0
    _roll(pdir, [41, 51, 61], 71)
    assert export(tmp_path, "second", *flags)[0] == 0
    _iceberg_rollback(uri, 1)
    conf = tmp_path / "iceberg-guard.json"
    conf.write_text(
        json.dumps(
            {
                "export": {"table": uri, "format": "iceberg"},
                "retention": {"topics": {"logs": {"segments_count": 2}}, "keep_unexported": {"table": "export"}},
            }
        )
    )
    from conftest import run_job_script

    report = tmp_path / "ret.json"
    r = run_job_script(
        "retention", "--data-dir", base, "--broker-stopped", "--report", str(report), "--config", str(conf),
        where="driver",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    (p,) = json.loads(report.read_text())["partitions"]
    assert p["exported_last"] == 40 and _ro(pdir)[0] == (41, 50)


def test_a_restore_to_a_restore_and_a_restore_that_undoes_nothing(tmp_path):
    """RESTOREs that keep the recording commit change nothing; a RESTORE back to before a RESTORE is followed."""
    from deltalake import DeltaTable

    base = str(tmp_path / "base")
    uri = str(tmp_path / "table")
    flags = ["--data-dir", base, "--table", uri]
    pdir = _logs(base, [(1, 10)], 11)  # 1..20
    assert export(tmp_path, "a", *flags)[0] == 0  # v1: 20
    _roll(pdir, [21], 31)
    assert export(tmp_path, "b", *flags)[0] == 0  # v2: 40
    DeltaTable(uri).restore(1)  # v3: undoes v2
    assert ExportedSeqs(uri).recorded("logs", 0).version == 20
    DeltaTable(uri).restore(2)  # v4: back to v2, before the RESTORE that undid it
    got = ExportedSeqs(uri).recorded("logs", 0)
    assert (got.version, got.undone) == (40, None) and only_seqs(uri) == list(range(1, 41))
    DeltaTable(uri).restore(2)  # v5: to the version that recorded 40: nothing undone
    assert ExportedSeqs(uri).recorded("logs", 0).version == 40
    DeltaTable(uri).restore(0)  # v6: the empty table
    got = ExportedSeqs(uri).recorded("logs", 0)
    assert got.version is None and got.recorded == 40 and "RESTORE at table version 6" in got.undone
    code, rep = export(tmp_path, "c", *flags)
    assert code == 0 and rep["partitions"][0]["from_seq"] == 1 and only_seqs(uri) == list(range(1, 41))


def test_delta_spark_restore_is_checked(spark, tmp_path):
    """delta-spark's RESTORE (`restoreToVersion`): the same check; its own engine refuses to skip the rows again and
    the delta-rs engine exports them."""
    from delta.tables import DeltaTable as SparkDeltaTable

    base = str(tmp_path / "base")
    uri = str(tmp_path / "table")
    flags = ["--data-dir", base, "--table", uri]
    pdir = _logs(base, [(1, 10), (11, 10)], 21)
    assert export(tmp_path, "a", *flags)[0] == 0
    _roll(pdir, [31], 41)
    assert export(tmp_path, "b", *flags)[0] == 0
    SparkDeltaTable.forPath(spark, uri).restoreToVersion(1)
    got = ExportedSeqs(uri).recorded("logs", 0)
    assert (got.version, got.recorded) == (30, 50) and "RESTORE at table version 3" in got.undone
    from test_delta_spark import export_on

    from tank_log.errors import JobConfigError

    with pytest.raises(JobConfigError, match=r"logs/0 \(seqs 31\.\.50\).*--engine deltalake"):
        export_on(spark, *flags, "--engine", "spark")
    code, rep = export(tmp_path, "c", *flags)
    assert code == 0 and rep["partitions"][0]["rows"] == 20 and only_seqs(uri) == list(range(1, 51))
    assert sorted(r[0] for r in spark.read.format("delta").load(uri).select("seq").collect()) == list(range(1, 51))


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_messages_deleted_before_they_were_exported_are_named(tmp_path, fmt):
    """The table holds 1..40; the broker deleted 41..70 before they were exported: the run that crosses the gap
    exports 71.., names 41..70 (log, report, summary), exits 1; the next run is clean."""
    base = str(tmp_path / "base")
    uri = str(tmp_path / "table")
    flags = ["--data-dir", base, "--table", uri, "--format", fmt]
    pdir = _logs(base, [(1, 10), (11, 10), (21, 10)], 31)
    assert export(tmp_path, "first", *flags)[0] == 0
    _roll(pdir, [41, 51, 61], 71)
    for f in os.listdir(pdir):
        if f.endswith(".ilog") and int(f.split("-")[0]) <= 61:
            os.unlink(os.path.join(pdir, f))  # the broker's own retention
    code, rep = export(tmp_path, "gap", *flags)
    assert code == 1
    (p,) = rep["partitions"]
    assert p["status"] == "data-loss" and (p["lost_first_seq"], p["lost_last_seq"], p["lost_messages"]) == (41, 70, 30)
    assert "seqs 41..70 (30 seqs) are in neither the table nor the log" in p["reason"]
    assert rep["summary"]["lost_before_export"] == 30 and rep["summary"]["by_status"] == {"data-loss": 1}
    assert only_seqs(uri, fmt) == list(range(1, 41)) + list(range(71, 81))
    code, rep = export(tmp_path, "next", *flags)
    assert code == 0 and rep["partitions"][0]["status"] == "up-to-date"


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_two_brokers_same_names_one_table(tmp_path, fmt):
    """Two brokers whose topics have the same names: each exports all of its messages into one table under its own
    source; each one's guard reads its own versions; re-runs are up to date."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    uri = str(tmp_path / "table")
    _logs(a, [(1, 10), (11, 10)], 21)  # 1..30
    _logs(b, [(1, 10), (11, 10), (21, 10), (31, 10)], 41)  # 1..50
    code, rep = export(tmp_path, "a", "--data-dir", a, "--table", uri, "--format", fmt, "--source", "broker-a")
    assert code == 0 and rep["summary"]["source"] == "broker-a"
    code, rep = export(tmp_path, "b", "--data-dir", b, "--table", uri, "--format", fmt, "--source", "broker-b")
    assert code == 0, rep
    (p,) = rep["partitions"]
    assert p["status"] == "exported" and p["rows"] == 50 and p["previous_version"] is None
    rows = seqs_of(uri, fmt)
    assert [r for r in rows if r[0] == "broker-a"] == [("broker-a", "logs", 0, s) for s in range(1, 31)]
    assert [r for r in rows if r[0] == "broker-b"] == [("broker-b", "logs", 0, s) for s in range(1, 51)]
    assert len(rows) == 80
    assert ExportedSeqs(uri, fmt=fmt, source="broker-a").last_seq("logs", 0) == 30
    assert ExportedSeqs(uri, fmt=fmt, source="broker-b").last_seq("logs", 0) == 50
    assert ExportedSeqs(uri, fmt=fmt, source="broker-c").last_seq("logs", 0) is None
    for name, d in (("broker-a", a), ("broker-b", b)):
        code, rep = export(
            tmp_path, f"again-{name}", "--data-dir", d, "--table", uri, "--format", fmt, "--source", name
        )
        assert code == 0 and rep["partitions"][0]["status"] == "up-to-date"
    # the guard of the retention job takes the source from --source
    r, rep = (
        _retention(b, tmp_path, "b-guard", "--keep-unexported", uri, "--source", "broker-b")
        if fmt == "delta"
        else (None, None)
    )
    if r is not None:
        assert r.returncode == 0, r.stderr[-3000:]
        assert rep["partitions"][0]["exported_last"] == 50


def test_replicas_declaring_one_source_are_exported_once(tmp_path):
    """Two replicas of one partition (the same messages), each exported with the same --source: the second finds
    the first's version and exports nothing."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    uri = str(tmp_path / "table")
    _logs(a, [(1, 10)], 11)
    _logs(b, [(1, 10)], 11)
    assert export(tmp_path, "a", "--data-dir", a, "--table", uri, "--source", "cluster-1")[0] == 0
    code, rep = export(tmp_path, "b", "--data-dir", b, "--table", uri, "--source", "cluster-1")
    assert code == 0 and rep["partitions"][0]["status"] == "up-to-date"
    assert only_seqs(uri) == list(range(1, 21))


def _table_of_before_sources(tmp_path, fmt, rows, recorded):
    """A table as this export wrote it before sources: no `source` column, no owner of its versions, each
    partition's version under the unsourced id (`recorded`: (topic, partition) → last seq)."""
    from tank_log.lakehouse import implementation
    from tank_spark.export.schema import SOURCE

    uri = str(tmp_path / "old-table")
    rows = rows.drop_columns([SOURCE.name])
    table = implementation(fmt).create(TableLocation.of(uri, fmt=fmt), rows.schema, ("topic", "date"), {})
    versions = {app_id(table.table_id, t, p): v for (t, p), v in recorded.items()}
    if fmt == "delta":
        from deltalake import CommitProperties, Transaction, write_deltalake

        txns = [Transaction(a, v) for a, v in versions.items()]
        write_deltalake(uri, rows, mode="append", commit_properties=CommitProperties(app_transactions=txns))
    else:
        tx = table.table.transaction()
        tx.set_properties({a: str(v) for a, v in versions.items()})
        tx.append(rows)
        tx.commit_transaction()
    assert LEGACY_SOURCE_KEY not in TableLocation.of(uri, fmt=fmt).existing().properties()
    return uri


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_table_written_before_sources_belongs_to_its_first_sourced_export(tmp_path, fmt):
    """The first sourced export into a table of before sources adds the `source` column, claims the old versions
    (nothing exported twice) and appends after them; a second broker's same-named partition is its own source."""
    base, other = str(tmp_path / "base"), str(tmp_path / "other")
    pdir = _logs(base, [(1, 10)], 11)  # 1..20
    _logs(other, [(1, 10)], 11)
    new = str(tmp_path / "new")
    assert export(tmp_path, "seed", "--data-dir", base, "--table", new, "--format", fmt)[0] == 0
    rows = TableLocation.of(new, fmt=fmt).existing().to_pyarrow_dataset().to_table()
    uri = _table_of_before_sources(tmp_path, fmt, rows, {("logs", 0): 20})
    # before the first sourced export, the guard of any source reads the old versions, as before sources
    assert ExportedSeqs(uri, fmt=fmt, source="x").last_seq("logs", 0) == 20

    _roll(pdir, [21], 31)  # 21..40
    code, rep = export(tmp_path, "x", "--data-dir", base, "--table", uri, "--format", fmt, "--source", "x")
    assert code == 0
    (p,) = rep["partitions"]
    assert (p["previous_version"], p["from_seq"], p["rows"]) == (20, 21, 20)
    table = TableLocation.of(uri, fmt=fmt).existing()
    assert table.properties()[LEGACY_SOURCE_KEY] == "x" and table.arrow_schema().names[-1] == "source"
    got = seqs_of(uri, fmt)
    assert got == [(None, "logs", 0, s) for s in range(1, 21)] + [("x", "logs", 0, s) for s in range(21, 41)]

    code, rep = export(tmp_path, "y", "--data-dir", other, "--table", uri, "--format", fmt, "--source", "y")
    assert code == 0 and rep["partitions"][0]["rows"] == 20 and rep["partitions"][0]["previous_version"] is None
    assert ExportedSeqs(uri, fmt=fmt, source="x").last_seq("logs", 0) == 40
    assert ExportedSeqs(uri, fmt=fmt, source="y").last_seq("logs", 0) == 20
    code, rep = export(tmp_path, "x2", "--data-dir", base, "--table", uri, "--format", fmt, "--source", "x")
    assert code == 0 and rep["partitions"][0]["status"] == "up-to-date"


def test_iceberg_latest_table_with_an_empty_snapshot(tmp_path):
    """An Iceberg latest table whose snapshot holds no data file (every message keyless) takes later exports."""
    from tank_log.format.bundle import Message
    from tank_log.storage.writer import write_segment

    base = str(tmp_path / "base")
    uri = str(tmp_path / "table")
    pdir = os.path.join(base, "keyless", "0")
    os.makedirs(pdir)
    write_segment(pdir, [Message(i, 1_700_000_000_000 + i, None, b"v") for i in range(1, 11)], active=True)
    flags = ["--data-dir", base, "--table", uri, "--format", "iceberg", "--mode", "latest"]
    code, rep = export(tmp_path, "a", *flags)
    assert code == 0 and rep["summary"]["keyless_skipped"] == 10
    code, rep = export(tmp_path, "b", *flags)  # before: ArrowInvalid: Must pass at least one table
    assert code == 0 and rep["partitions"][0]["status"] == "up-to-date"
    code, rep = export(tmp_path, "c", *flags, "--optimize")
    assert code == 0


def test_app_ids_name_the_source():
    assert app_id("u", "t", 0) == "tank-log:u:t:0"
    assert app_id("u", "t", 0, "b1") == "tank-log:u@b1:t:0"
    assert default_source() and LEGACY_SOURCE_KEY.startswith("tank_log.")


@pytest.mark.slow
def test_sources_on_spark_executors_and_through_spark_sql(tmp_path):
    """On Spark's executors (binary values: the direct path) and through Spark SQL (JSON values): the same source
    column and versions; after a RESTORE, the executors' run exports the lost rows again. The JSON run (its own
    table, from `b`, which nothing changes) goes on beside the others' runs."""
    from concurrent.futures import ThreadPoolExecutor

    from deltalake import DeltaTable
    from test_job_export import run_job

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    uri, juri = str(tmp_path / "table"), str(tmp_path / "json-table")
    pdir = _logs(a, [(1, 10)], 11)
    _logs(b, [(1, 10)], 11)
    json_args = ["--data-dir", b, "--table", juri, "--source", "broker-b", "--value-format", "json"]
    with ThreadPoolExecutor(1) as pool:
        json_run = pool.submit(run_job, *json_args, "--value-schema", "v string", executors=True)
        r = run_job("--data-dir", a, "--table", uri, "--source", "broker-a", executors=True)
        assert r.returncode == 0, r.stderr[-3000:]
        r = run_job("--data-dir", b, "--table", uri, "--source", "broker-b", executors=True)
        assert r.returncode == 0, r.stderr[-3000:]
        assert {s for s, *_ in seqs_of(uri)} == {"broker-a", "broker-b"} and len(seqs_of(uri)) == 40
        _roll(pdir, [21], 31)
        r = run_job("--data-dir", a, "--table", uri, "--source", "broker-a", executors=True)
        assert r.returncode == 0, r.stderr[-3000:]
        DeltaTable(uri).restore(2)  # undoes broker-a's second export
        report = tmp_path / "restored.json"
        r = run_job("--data-dir", a, "--table", uri, "--source", "broker-a", "--report", str(report), executors=True)
        assert r.returncode == 0, r.stderr[-3000:]
        (p,) = json.loads(report.read_text())["partitions"]
        assert (p["from_seq"], p["rows"], p["recorded_version"]) == (21, 20, 40) and "RESTORE" in p["undone"]
        assert [s for src, _, _, s in seqs_of(uri) if src == "broker-a"] == list(range(1, 41))
        r = json_run.result()
    assert r.returncode == 0, r.stderr[-3000:]
    assert {s for s, *_ in seqs_of(juri)} == {"broker-b"}
    assert ExportedSeqs(juri, source="broker-b").last_seq("logs", 0) == 20
