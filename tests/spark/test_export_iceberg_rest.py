"""The export into Iceberg tables named in a REST catalog: the Apache Iceberg reference server (RESTCatalogServer,
started by scripts/iceberg-rest-catalog.sh on a loopback port, its SQLite state in a folder) holds `tank.events`;
the job names the table (`export.table: namespace.table`, `export.catalog: {type: rest, uri}`), the catalog says
where its files go. Read back through the catalog by pyiceberg and from the metadata file by DuckDB, equal to the
broker's dump; each (topic, partition, seq) once across reruns; a catalog outage at the commit records nothing and
the rerun after the restart completes."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT, WHERE, copy_tree, data_dir, duckdb_with, free_port, run_job_script, wait_for_hold
from test_job_export import dump_rows, roll_and_append

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(ROOT, "scripts", "iceberg-rest-catalog.sh")
TOPICS = {"events", "seqgap"}


class Server:
    """The reference REST catalog server of this module: started and stopped with the project's script."""

    def __init__(self, port, state):
        self.port, self.state, self.uri = port, state, f"http://127.0.0.1:{port}"

    def start(self):
        r = subprocess.run(["bash", SCRIPT, "start", str(self.port), self.state], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr

    def stop(self):
        r = subprocess.run(["bash", SCRIPT, "stop", self.state], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr

    def catalog(self):
        from pyiceberg.catalog import load_catalog

        return load_catalog("test", type="rest", uri=self.uri)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not os.path.exists(os.path.join(ROOT, ".jars", "iceberg-rest", ".installed")):
        pytest.fail("the REST catalog server's jars are missing: bash scripts/setup.sh fetches them")
    s = Server(free_port(), str(tmp_path_factory.mktemp("rest-catalog")))
    s.start()
    yield s
    s.stop()
    with open(os.path.join(s.state, "server.log")) as log:  # nothing of the server outlives its stop
        assert "Started" in log.read()
    assert not os.path.exists(os.path.join(s.state, "server.pid"))


def config(tmp_path, server, table):
    path = tmp_path / "job.yaml"
    export = {"table": table, "format": "iceberg", "catalog": {"type": "rest", "uri": server.uri}}
    path.write_text(yaml.safe_dump({"export": export}))
    return str(path)


def run(cfg, *args, env=None):
    return run_job_script("export_delta", "--config", cfg, *args, where="driver", env_extra=env)


def rows(server, name):
    d = server.catalog().load_table(name).scan().to_arrow().to_pydict()
    return sorted(zip(d["topic"], d["partition"], d["seq"], d["value"], strict=True))


def summary(path):
    return json.load(open(path))["summary"]


def test_export_by_name_read_by_pyiceberg_and_duckdb_exactly_once(tmp_path, server):
    """The first export creates `tank.events` where the catalog puts it (under its warehouse) and holds every message
    of the fixture; pyiceberg through the catalog and DuckDB from the metadata file read the dump; a rerun exports
    nothing and commits nothing; new messages are exported once, by Spark's executors (which locate the table through
    the catalog too)."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    cfg = config(tmp_path, server, "tank.events")
    args = ["--data-dir", base, "--topics", ",".join(sorted(TOPICS))]
    r = run(cfg, *args, "--report", str(tmp_path / "1.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    expected = dump_rows("A_multi", TOPICS)
    assert rows(server, "tank.events") == expected
    table = server.catalog().load_table("tank.events")
    assert table.metadata.location.removeprefix("file://") == os.path.join(server.state, "warehouse", "tank", "events")
    metadata = table.metadata_location.removeprefix("file://")
    duck = duckdb_with("avro", "iceberg").execute(
        f"SELECT topic, partition, seq, value FROM iceberg_scan('{metadata}')"
    )
    assert sorted(duck.fetchall()) == expected
    snapshots = len(table.snapshots())

    r = run(cfg, *args, "--report", str(tmp_path / "2.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(tmp_path / "2.json")["rows"] == 0
    assert len(server.catalog().load_table("tank.events").snapshots()) == snapshots

    expected = sorted(expected + roll_and_append(base, "events", 25))
    r = run(cfg, *args, "--in-driver-max-bytes=0", "--report", str(tmp_path / "3.json"))  # on Spark's executors
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(tmp_path / "3.json")["executed_on"] == "executors"
    assert summary(tmp_path / "3.json")["rows"] == 75  # 25 new messages in each of the topic's 3 partitions
    assert rows(server, "tank.events") == expected


def test_a_catalog_outage_at_the_commit_records_nothing_and_the_rerun_completes(tmp_path, server):
    """A run writes its files and waits at its commit; the catalog server stops; the run fails with one line naming
    the catalog (exit 1, no traceback) and the table has none of its rows; after the restart (same state) the rerun
    exports every message once."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    cfg = config(tmp_path, server, "tank.outage")
    args = ["--data-dir", base, "--topics", "events"]
    assert run(cfg, *args).returncode == 0
    before = rows(server, "tank.outage")
    appended = roll_and_append(base, "events", 9)
    hold = str(tmp_path / "release")
    a = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[2]", *WHERE["driver"]]
        + ["--config", cfg, *args],
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", TANK_LOG_EXPORT_HOLD=hold),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_hold(hold + ".ready", a)
    server.stop()
    try:
        open(hold, "w").close()
        _, err = a.communicate(timeout=300)
    finally:
        server.start()
    assert a.returncode == 1, err[-3000:]
    assert "Traceback" not in err and f"catalog {server.uri}" in err, err[-3000:]
    assert rows(server, "tank.outage") == before  # nothing of the run is in the table
    r = run(cfg, *args, "--report", str(tmp_path / "rerun.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary(tmp_path / "rerun.json")["rows"] == len(appended)
    assert rows(server, "tank.outage") == sorted(before + appended)


@pytest.mark.parametrize(
    ("export", "message"),
    [
        ({"table": "/abs/events", "format": "iceberg"}, "in a REST catalog a table is named namespace.table"),
        ({"table": "events", "format": "iceberg"}, "in a REST catalog a table is named namespace.table"),
        ({"table": "tank.events"}, "catalog goes with format iceberg"),
        ({"table": "tank.events", "format": "iceberg", "type": "glue"}, "catalog.type: 'glue': expected rest or sql"),
        ({"table": "tank.events", "format": "iceberg", "token": "t", "credential": "c"}, "token or credential"),
    ],
)
def test_bad_rest_settings_are_one_line_and_exit_2(tmp_path, export, message):
    """A table that is not a name, a REST catalog for a Delta table, an unknown catalog type, two credentials:
    refused before anything runs (the catalog is never asked), one line, exit 2; the token is never printed."""
    catalog = {"type": export.pop("type", "rest"), "uri": "http://127.0.0.1:9"}
    catalog.update({k: export.pop(k) for k in ("token", "credential") if k in export})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"export": {**export, "catalog": catalog}}))
    r = run(str(path), "--data-dir", data_dir("A_multi"))
    assert r.returncode == 2, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if "ERROR" in line or "error" in line.lower()]
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert len(errors) <= 1 and "=t" not in r.stderr and "'t'" not in r.stderr


def test_a_stale_writer_gets_the_catalogs_conflict_and_commits_nothing(server):
    """Two writers read `tank.stale` at the same snapshot; the second commit is refused by the catalog itself (its
    requirement on the branch's snapshot fails: HTTP 409 → `CommitConflict`). Its version and files are not in the
    table, and the first writer's data and version came in one commit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tank_log.lakehouse import CommitConflict, DataFile, TableLocation
    from tank_log.lakehouse.location import RestCatalog

    location = TableLocation.of("tank.stale", fmt="iceberg", catalog=RestCatalog(server.uri))
    assert location.uri == os.path.join(server.state, "warehouse", "tank", "stale") and location.open() is None
    schema = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("seq", pa.int64())])
    location.create(schema, ("topic",))

    def data_file(name, seqs):
        os.makedirs(os.path.join(location.uri, "topic=a"), exist_ok=True)
        path = f"topic=a/{name}.parquet"
        table = pa.table({"topic": ["a"] * len(seqs), "partition": [0] * len(seqs), "seq": seqs}, schema)
        pq.write_table(table, os.path.join(location.uri, path))
        return DataFile(path, location.size(path), {"topic": "a"}, 0, len(seqs), "{}")

    first, stale = location.existing(), location.existing()
    aid = first.app_id("a", 0)
    first.commit(schema, [data_file("first", [1, 2, 3])], {aid: 3}, "run-1", {})
    with pytest.raises(CommitConflict):
        stale.commit(schema, [data_file("stale", [1, 2, 3, 4])], {aid: 4}, "run-2", {})
    table = TableLocation.of("tank.stale", fmt="iceberg", catalog=RestCatalog(server.uri)).existing()
    assert table.recorded_version("a", 0) == 3 and table.version() == 1
    assert sorted(server.catalog().load_table("tank.stale").scan().to_arrow()["seq"].to_pylist()) == [1, 2, 3]
    assert table.referenced_files() == {"topic=a/first.parquet"}
    assert [h.run for h in table.run_history() if h.run] == ["run-1"]


def test_two_hosts_export_once_and_a_recreated_table_starts_afresh(tmp_path, server):
    """Two writers on two "hosts" (two processes, each in its own working directory) export the same partitions
    into `tank.shared`: one waits at its commit while the other commits everything; released, it meets the catalog's
    conflict, re-plans against the new versions and commits nothing: each message once. The table dropped and created
    again under the same name is another table (another uuid): the watermarks were the old one's, so the next export
    writes every message again, once."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    cfg = config(tmp_path, server, "tank.shared")
    args = ["--data-dir", base, "--topics", ",".join(sorted(TOPICS))]
    expected = dump_rows("A_multi", TOPICS)
    job = [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[1]", "--config", cfg]
    hosts = [tmp_path / "host-a", tmp_path / "host-b"]
    for h in hosts:
        h.mkdir()
    hold = str(tmp_path / "release")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    a = subprocess.Popen(
        [*job, *args, "--report", str(tmp_path / "a.json")],
        cwd=hosts[0],
        env=dict(env, TANK_LOG_EXPORT_HOLD=hold),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_hold(hold + ".ready", a)
        b = subprocess.run(
            [*job, *args, "--report", str(tmp_path / "b.json")], cwd=hosts[1], env=env, capture_output=True, text=True
        )
        assert b.returncode == 0, b.stderr[-3000:]
        assert summary(tmp_path / "b.json")["rows"] == len(expected)
    finally:
        open(hold, "w").close()
        _, err = a.communicate(timeout=300)
    assert a.returncode == 0, err[-3000:]
    assert summary(tmp_path / "a.json")["rows"] == 0  # re-planned: the other host had committed it all
    assert rows(server, "tank.shared") == expected
    old = str(server.catalog().load_table("tank.shared").metadata.table_uuid)

    server.catalog().drop_table("tank.shared")
    r = run(cfg, *args, "--report", str(tmp_path / "again.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert str(server.catalog().load_table("tank.shared").metadata.table_uuid) != old
    assert summary(tmp_path / "again.json")["rows"] == len(expected)
    assert rows(server, "tank.shared") == expected
