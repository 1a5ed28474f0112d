"""Every path that reads or writes the export's table takes the same REST catalog settings as the export: retention's
guard (`keep_unexported`), `tank-log stats` and `tank-log audit` (`--catalog http://…`), the import (`--catalog` or
the config), `--mode latest` and the export's upkeep. One reference REST catalog server (RESTCatalogServer, started by
scripts/iceberg-rest-catalog.sh) serves the whole module; the data is small."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from conftest import ROOT, copy_tree, data_dir, run_job_script
from test_export_iceberg_rest import Server
from test_export_iceberg_rest import server as server  # noqa: F401 (the module's one server)
from test_lakehouse_guard import _logs, _roll

pytestmark = pytest.mark.slow
TANK_LOG = [sys.executable, "-m", "tank_log.tools.cli"]
LIMITS = {"topics": {"logs": {"segments_count": 2}}}  # keep 2 RO segments: tank-log's limit, not the broker's


def write_config(tmp_path, server: Server, table: str, **more) -> str:
    path = tmp_path / "job.yaml"
    export = {"table": table, "format": "iceberg", "catalog": {"type": "rest", "uri": server.uri}, **more}
    path.write_text(yaml.safe_dump({"export": export, "retention": {**LIMITS, "keep_unexported": {"table": "export"}}}))
    return str(path)


def cli(*args, env=None):
    return subprocess.run(
        [*TANK_LOG, *args], capture_output=True, text=True, timeout=300, env=dict(os.environ, **(env or {}))
    )


def job(name, cfg, *args, tmp_path=None, report=None, env=None):
    more = ["--report", str(tmp_path / f"{report}.json")] if report else []
    r = run_job_script(name, *(["--config", cfg] if cfg else []), *args, *more, where="driver", env_extra=env)
    return r, (json.loads((tmp_path / f"{report}.json").read_text()) if report and r.returncode in (0, 1) else None)


def by_name(server: Server, table: str, *flags: str) -> list[str]:
    """The flags naming `table` in the REST catalog of `server`, as a command line gives them."""
    return [*flags, table, "--catalog" if "--table" in flags else "--export-catalog", server.uri]


def test_guard_stats_audit_and_import_by_name(tmp_path, server):
    """A table named `tank.guarded` in the catalog: retention's guard keeps what the table lacks (`keep_unexported:
    {table: export}`), stats and audit measure the lag (`--catalog http://…`, or `--config` naming the export's
    table), and, caught up, the import by name (`--table NAME --format iceberg --catalog http://…`, no config)
    restores a base the audit finds equal."""
    base = str(tmp_path / "base")
    pdir = _logs(base, [(1, 10), (11, 10), (21, 10)], 31)
    cfg = write_config(tmp_path, server, "tank.guarded")
    r, _ = job("export_delta", cfg, "--data-dir", base)
    assert r.returncode == 0, r.stderr[-3000:]  # the table holds 1..40
    _roll(pdir, [41, 51, 61], 71)  # the table lacks 41..80

    r = cli("stats", base, "--json", "--export-format", "iceberg", *by_name(server, "tank.guarded", "--export-table"))
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = json.loads(r.stdout)
    assert (row["last_seq"], row["export_lag_messages"]) == (80, 40)
    r = cli("audit", base, "--json", "--format", "iceberg", *by_name(server, "tank.guarded", "--table"))
    assert r.returncode == 0, r.stderr[-3000:]
    (audit,) = json.loads(r.stdout)["partitions"]
    assert (audit["verdict"], audit["recorded_seq"], audit["pending"]["count"], audit["unaccounted"]) == (
        "pending",
        40,
        40,
        0,
    )

    r, rep = job("retention", cfg, "--data-dir", base, "--broker-stopped", tmp_path=tmp_path, report="behind")
    assert r.returncode == 0, r.stderr[-3000:]
    (p,) = rep["partitions"]
    assert p["status"] == "deleted" and p["exported_last"] == 40
    assert [d["base"] for d in p["deleted"]] == [1, 11, 21, 31]
    assert (p["kept_unexported"]["first_seq"], p["kept_unexported"]["last_seq"]) == (41, 50)

    r, _ = job("export_delta", cfg, "--data-dir", base)
    assert r.returncode == 0, r.stderr[-3000:]  # caught up: 1..80
    r = cli("audit", base, "--config", cfg)  # the table, its format and catalog: the config's export section
    assert r.returncode == 0 and "verdict: ok" in r.stdout, r.stdout + r.stderr[-3000:]
    r = cli("stats", base, "--json", "--config", cfg)
    assert r.returncode == 0 and json.loads(r.stdout)[0]["export_lag_messages"] == 0, r.stderr[-3000:]

    restored = str(tmp_path / "restored")
    named = by_name(server, "tank.guarded", "--table")
    r, rep = job(
        "import_delta", None, "--data-dir", restored, "--format", "iceberg", *named, tmp_path=tmp_path, report="import"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert rep["summary"]["rows"] == 80 and rep["summary"]["by_status"] == {"imported": 1}
    r = cli("audit", restored, "--json", "--format", "iceberg", *named)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    (audit,) = json.loads(r.stdout)["partitions"]
    assert (audit["verdict"], audit["log_messages"], audit["table_rows"]) == ("ok", 80, 80)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["audit", "--format", "iceberg", "--catalog", "http://127.0.0.1:9", "--table", "/abs/t"],
            {},
            "namespace.table",
        ),
        (["audit", "--catalog", "http://127.0.0.1:9", "--table", "tank.t"], {}, "goes with format iceberg"),
        (
            [
                "stats",
                "--export-format",
                "iceberg",
                "--export-catalog",
                "http://127.0.0.1:9",
                "--export-table",
                "tank.t",
            ],
            {"TANK_LOG_CATALOG_TOKEN": "secret-t", "TANK_LOG_CATALOG_CREDENTIAL": "secret-c"},
            "--export-catalog: token or credential, not both",
        ),
    ],
)
def test_bad_catalog_flags_are_one_line_and_exit_2(tmp_path, args, env, message):
    """A path where a REST catalog names tables, a catalog for a Delta table, two credentials in the environment:
    refused before the catalog is asked, one line, exit 2, no secret printed."""
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    r = cli(args[0], base, *args[1:], env=env)
    assert r.returncode == 2 and message in r.stderr, r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) == 1 and "secret" not in r.stderr


def test_latest_mode_and_upkeep_by_name(tmp_path, server):
    """`--mode latest` merges into `tank.latest` named in the catalog (one row per live key, as the Iceberg export
    merges into a SQL catalog's table), and the upkeep (`--upkeep-only --optimize`) rewrites its files by name too."""
    base = copy_tree(data_dir("E_before"), str(tmp_path / "data"))
    cfg = write_config(tmp_path, server, "tank.latest")
    r, rep = job("export_delta", cfg, "--data-dir", base, "--mode", "latest", tmp_path=tmp_path, report="latest")
    assert r.returncode == 0, r.stderr[-3000:]
    kv = rep["partitions"][0]
    assert (kv["rows"], kv["keys"], kv["tombstones"]) == (8810, 2150, 47)
    table = server.catalog().load_table("tank.latest")
    d = table.scan().to_arrow().to_pydict()
    keys = list(zip(d["topic"], d["partition"], d["key"], strict=True))
    assert len(keys) == len(set(keys)) == 2150 - 47
    assert table.properties["tank_log.export.mode"] == "latest"

    r, rep = job("export_delta", cfg, "--data-dir", base, "--mode", "latest", "--upkeep-only", "--optimize",
                 tmp_path=tmp_path, report="upkeep")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    (step,) = rep["summary"]["upkeep"]
    assert step["operation"] == "optimize" and step["files_after"] <= step["files_before"]
    assert server.catalog().load_table("tank.latest").scan().to_arrow().num_rows == 2150 - 47


def test_the_continuous_export_by_name(tmp_path, server):
    """`--continuous` into `tank.stream` named in the catalog, partitioned by `topic, hour(ts)`: what the base holds,
    then what the broker appends, each message once; SIGTERM ends it cleanly (exit 0, the report written)."""
    base = str(tmp_path / "base")
    pdir = _logs(base, [(1, 10), (11, 10), (21, 10)], 31)
    cfg = write_config(tmp_path, server, "tank.stream", partition_by=["topic", "hour(ts)"])
    args = ["--config", cfg, "--data-dir", base, "--continuous", "--checkpoint", str(tmp_path / "ck")]
    query = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[2]", *args,
         "--trigger-interval", "1s", "--report", str(tmp_path / "stream.json")],
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip

    def seqs():
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return sorted(server.catalog().load_table("tank.stream").scan().to_arrow()["seq"].to_pylist())
        except NoSuchTableError:
            return []

    try:
        wait_until(lambda: seqs() == list(range(1, 41)), query, "the first 40 messages")
        _roll(pdir, [41, 51, 61], 71)
        wait_until(lambda: seqs() == list(range(1, 81)), query, "the 40 appended")
    finally:
        query.send_signal(signal.SIGTERM)
        _, err = query.communicate(timeout=120)
    assert query.returncode == 0, err[-3000:]
    summary = json.loads((tmp_path / "stream.json").read_text())["summary"]
    assert summary["rows"] == 80 and summary["stopped"] == "signal"
    assert seqs() == list(range(1, 81))
    spec = server.catalog().load_table("tank.stream").spec()
    assert [(f.name, str(f.transform)) for f in spec.fields] == [("topic", "identity"), ("ts_hour", "hour")]


def wait_until(done, proc, what, timeout=180):
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, f"the query ended before {what}: " + proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, f"{what} not in the table after {timeout}s"
        time.sleep(0.5)


@pytest.mark.parametrize("command", ["audit", "stats", "import_delta", "export_delta"])
def test_a_catalog_out_of_reach_is_one_line_and_exit_1(tmp_path, command):
    """No server at the catalog's address: each command stops before doing anything, with one line naming the catalog
    (exit 1, no traceback)."""
    down = "http://127.0.0.1:9"
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a")) if command == "export_delta" else data_dir("A_multi")
    if command == "audit":
        r = cli("audit", base, "--format", "iceberg", "--table", "tank.t", "--catalog", down)
    elif command == "stats":
        r = cli("stats", base, "--export-format", "iceberg", "--export-table", "tank.t", "--export-catalog", down)
    else:
        into = str(tmp_path / "restored") if command == "import_delta" else base
        r, _ = job(command, None, "--data-dir", into, "--format", "iceberg", "--table", "tank.t", "--catalog", down)
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"catalog {down}: unreachable" in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]


def test_a_catalog_flag_takes_its_secrets_from_the_environment(monkeypatch):
    from tank_log.lakehouse.location import RestCatalog, catalog_setting

    monkeypatch.setenv("TANK_LOG_CATALOG_WAREHOUSE", "lake")
    monkeypatch.setenv("TANK_LOG_CATALOG_TOKEN", "secret-t")
    got = catalog_setting("http://127.0.0.1:9", None, "iceberg")
    assert got == RestCatalog("http://127.0.0.1:9", warehouse="lake", token="secret-t")
    assert "secret" not in repr(got) and "secret" not in str(got)
    assert catalog_setting(None, "sqlite:///c.db", "iceberg") == "sqlite:///c.db"  # no flag: the config's


def test_config_check_hides_the_catalogs_token(tmp_path):
    """`tank-log config check` prints the config it read, but not a REST catalog's token or credential."""
    path = tmp_path / "job.yaml"
    catalog = {"type": "rest", "uri": "http://127.0.0.1:9", "token": "secret-t"}
    other = {"type": "rest", "uri": "http://127.0.0.1:9", "credential": "id:secret-c"}
    keep = {"table": "tank.t", "format": "iceberg", "catalog": other}
    path.write_text(yaml.safe_dump({"export": {"table": "tank.t", "format": "iceberg", "catalog": catalog},
                                    "retention": {"keep_unexported": keep}}))  # fmt: skip
    r = cli("config", "check", str(path))
    assert r.returncode == 0, r.stderr[-3000:]
    printed = json.loads(r.stdout)
    assert printed["export"]["catalog"]["token"] == "***" and "secret" not in r.stdout
    assert printed["retention"]["keep_unexported"]["catalog"]["credential"] == "***"
