"""The import of a table that holds several brokers' partitions (`--source`): one broker's rows restore its base
path; without a source, such a table is refused before anything is written."""

from __future__ import annotations

import os

from conftest import data_dir

from tank_log.tools.stats import stats_path


def export(*argv: str) -> int:
    from tank_spark.export.job import main

    return int(main(["--master", "local[1]", *argv]))


def import_table(*argv: str) -> int:
    from tank_spark.import_delta import main

    return int(main(["--master", "local[1]", *argv]))


def test_one_brokers_rows_restore_its_base_path(tmp_path, capsys):
    table = str(tmp_path / "table")
    assert export("--data-dir", data_dir("A_multi"), "--table", table, "--source", "broker-a") == 0
    assert export("--data-dir", data_dir("C_misc"), "--table", table, "--source", "broker-b") == 0
    base = str(tmp_path / "restored")
    capsys.readouterr()
    assert import_table("--data-dir", base, "--table", table) == 2
    assert "holds the rows of 2 brokers (broker-a, broker-b): pass --source" in capsys.readouterr().err
    assert not os.path.exists(base) or not os.listdir(base)
    assert import_table("--data-dir", base, "--table", table, "--source", "broker-a") == 0
    restored = {(s.topic, s.partition): s.messages for s in stats_path(base)}
    assert sum(restored.values()) == 17537 and ("small", 0) in restored
    assert import_table("--data-dir", str(tmp_path / "b"), "--table", table, "--source", "broker-c") == 2
