"""The --py-files artifact: built by one command, importable, usable by spark-submit."""

import json
import os
import subprocess
import sys

from conftest import ROOT, copy_tree, data_dir


def test_zip_ships_the_packages_and_spark_submit_runs_a_job(tmp_path):
    out = (
        subprocess.run(
            ["bash", os.path.join(ROOT, "scripts", "package.sh")],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    assert out.endswith("dist/tank_log.zip") and os.path.exists(out)
    code = (
        f"import sys; sys.path.insert(0, {out!r}); import tank_log.storage.segment, tank_spark.export; "
        f"print(tank_log.storage.segment.__file__); print(tank_spark.export.__file__)"
    )
    files = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.split()
    assert all(f.startswith(out + os.sep) for f in files)

    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    report = tmp_path / "r.json"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    r = subprocess.run(
        [
            spark_submit,
            "--master",
            "local[2]",
            "--py-files",
            out,
            os.path.join(ROOT, "jobs", "retention.py"),
            "--data-dir",
            base,
            "--dry-run",
            "--in-driver-max-bytes=0",  # on the executors, which import tank-log from the zip
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.load(open(report))
    assert rep["status"] == "ok" and rep["spark"]["master"] == "local[2]"
    retained = next(p for p in rep["partitions"] if p["topic"] == "retained")
    assert retained["status"] == "nothing-to-do"  # retention.segments.count=3 already holds


def test_installed_package_runs_the_jobs_without_the_checkout(tmp_path):
    """`jobs/` was not installed, so jobs needed the repository; `python -m tank_spark.compact` did nothing."""
    import shutil

    src, site = tmp_path / "src", tmp_path / "site"  # build from a copy: the checkout gets no build/ directory
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "tank_log", "tank_spark"):
        copy = shutil.copytree if os.path.isdir(os.path.join(ROOT, name)) else shutil.copy
        copy(os.path.join(ROOT, name), src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, src],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = dict(os.environ, PYTHONPATH=str(site), SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    cli = [sys.executable, "-m", "tank_log.tools.cli"]
    path = subprocess.run(
        [*cli, "job-path", "retention"], capture_output=True, text=True, check=True, cwd=tmp_path, env=env
    ).stdout.strip()
    assert path == str(site / "tank_spark" / "entry_points" / "retention.py")
    base = copy_tree(data_dir("A_multi"), str(tmp_path / "a"))
    for cmd in (
        [sys.executable, "-m", "tank_spark.entry_points.retention", "--master", "local[1]"],
        [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", "local[1]", path],
    ):
        report = tmp_path / "r.json"
        r = subprocess.run(
            [*cmd, "--data-dir", base, "--dry-run", "--report", str(report)],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.load(open(report))["status"] == "ok"
