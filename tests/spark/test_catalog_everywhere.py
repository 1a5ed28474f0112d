"""Every path that reads or writes the export's table takes the same REST catalog settings as the export: retention's
guard (`keep_unexported`), `tank-log stats` and `tank-log audit` (`--catalog http://…`), the import (`--catalog` or
the config), `--mode latest` and the export's upkeep. One reference REST catalog server (RESTCatalogServer, started by
scripts/iceberg-rest-catalog.sh) serves the whole module; the data is small."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import copy_tree, data_dir, run_job_script
from test_export_iceberg_rest import Server
from test_export_iceberg_rest import server as server  # noqa: F401 (the module's one server)
from test_lakehouse_guard import _logs, _roll

pytestmark = pytest.mark.slow
TANK_LOG = [sys.executable, "-m", "tank_log.tools.cli"]
LIMITS = {"topics": {"logs": {"segments_count": 2}}}  # keep 2 RO segments: tank-log's limit, not the broker's


def write_config(tmp_path, server: Server, table: str) -> str:
    path = tmp_path / "job.yaml"
    export = {"table": table, "format": "iceberg", "catalog": {"type": "rest", "uri": server.uri}}
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
    {table: export}`), stats and audit measure the lag (`--catalog http://…`), and, caught up, the import by name
    (`--table NAME --format iceberg --catalog http://…`, no config) restores a base the audit finds equal."""
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
    r = cli("audit", base, "--format", "iceberg", *by_name(server, "tank.guarded", "--table"))
    assert r.returncode == 0 and "verdict: ok" in r.stdout, r.stdout + r.stderr[-3000:]

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
