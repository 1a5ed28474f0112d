"""The model-based check of the whole product (`bench/model_check.py`) in its short mode: a few seeded examples of
produce, the broker's life, compaction, retention, damage and the export against a model of the log and the table."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.slow
def test_every_combination_keeps_the_invariants(tmp_path):
    script = os.path.join(ROOT, "bench", "model_check.py")
    env = dict(os.environ, TMPDIR=str(tmp_path))  # the examples' data: removed with the test's directory
    done = subprocess.run(
        [sys.executable, script, "--short", "--seed", "1"], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().endswith("violations: 0")
    assert '"combinations"' in done.stdout
