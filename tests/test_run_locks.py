"""The suite's two workers: a test marked `alone` runs with nothing beside it, the others run side by side
(tests/run_locks.py), in a real pytest-xdist run of its own."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

from conftest import HERE
from run_locks import ENV

TESTS = """
import json, os, time
import pytest

def _run(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    with open(os.path.join(os.environ["SPANS"], name), "w") as fh:
        json.dump([start, time.monotonic()], fh)

@pytest.mark.alone
def test_alone():
    _run("alone", 2.0)

@pytest.mark.parametrize("i", range(8))
def test_beside(i):
    _run(f"beside{i}", 0.4)
"""


def test_an_alone_test_runs_with_nothing_beside_it_and_the_others_side_by_side(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "conftest.py").write_text('pytest_plugins = ["run_locks"]\n')
    (tmp_path / "t" / "test_spans.py").write_text(TESTS)
    spans, tmp = tmp_path / "spans", tmp_path / "tmp"
    spans.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "PYTEST_XDIST_WORKER")}
    env.update(PYTHONPATH=HERE, SPANS=str(spans), TMPDIR=str(tmp))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "load", "t"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = {name: json.loads((spans / name).read_text()) for name in os.listdir(spans)}
    assert len(got) == 9
    a0, a1 = got.pop("alone")
    assert all(end <= a0 or start >= a1 for start, end in got.values()), (a0, a1, got)  # nothing beside it
    others = sorted(got.values())
    assert any(b[0] < a[1] for a, b in itertools.pairwise(others)), others  # the others ran side by side
    assert [n for n in os.listdir(tmp) if n.startswith("tank-log-tests-")] == []  # the lock files are gone
