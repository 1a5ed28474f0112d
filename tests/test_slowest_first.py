"""The suite's order under pytest-xdist (tests/slowest_first.py): in a real two-worker `worksteal` run of its own,
each worker starts with its slowest tests, tests sharing a module-scoped fixture stay together, and an `alone` test
comes after the slow ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import HERE
from run_locks import ENV

CONFTEST = """
import pytest

pytest_plugins = ["run_locks", "slowest_first"]

def pytest_configure(config):
    for name in ("spark", "slow"):
        config.addinivalue_line("markers", name)
"""

# collected in this order: the two slowest (by their markers, as a test tests/durations.json does not list) last
FAST = """
import json, os, time
import pytest

def ran(name):
    with open(os.path.join(os.environ["RAN"], os.environ["PYTEST_XDIST_WORKER"]), "a") as fh:
        fh.write(json.dumps([name, time.monotonic()]) + "\\n")

@pytest.mark.parametrize("i", range(10))
def test_fast(i):
    ran(f"fast{i}")
    time.sleep(0.05)

@pytest.mark.alone
def test_alone():
    ran("alone")

@pytest.mark.slow
def test_slow():
    ran("slow")
    time.sleep(0.3)

@pytest.mark.spark
def test_spark():
    ran("spark")
"""

SHARED = """
import pytest
from test_a_fast import ran

@pytest.fixture(scope="module")
def service():
    ran("service-setup")
    yield

@pytest.mark.spark
@pytest.mark.parametrize("i", range(2))
def test_uses_the_service(service, i):
    ran(f"shared{i}")
"""


def test_each_worker_starts_with_its_slowest_tests(tmp_path):
    suite, ran, tmp = tmp_path / "t", tmp_path / "ran", tmp_path / "tmp"
    for d in (suite, ran, tmp):
        d.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_a_fast.py").write_text(FAST)
    (suite / "test_z_shared.py").write_text(SHARED)
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "PYTEST_XDIST_WORKER")}
    env.update(PYTHONPATH=f"{HERE}{os.pathsep}{suite}", RAN=str(ran), TMPDIR=str(tmp))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "worksteal", "t"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    order = {w: [json.loads(line)[0] for line in open(ran / w)] for w in os.listdir(ran)}
    assert sorted(order) == ["gw0", "gw1"], order
    firsts = {names[0] for names in order.values()}
    # the module-scoped fixture's unit (2 guessed Spark tests, 16 s) and the lone Spark test (8 s) start the run
    assert firsts == {"service-setup", "spark"}, order
    (shared,) = [names for names in order.values() if names[0] == "service-setup"]
    assert shared[:3] == ["service-setup", "shared0", "shared1"], order  # together, set up once
    assert sum(names.count("service-setup") for names in order.values()) == 1, order
    (other,) = [names for names in order.values() if names[0] == "spark"]
    assert other[1] == "slow", order  # then the slow one (3 s), before every fast one
    for names in order.values():  # the `alone` test after its lane's slow ones
        if "alone" in names:
            assert names.index("alone") > max(names.index(n) for n in ("spark", "slow", "shared1") if n in names)
