"""A full disk and a read-only mount, for real (a tmpfs in a private mount namespace, `unshare -rm`): one line
per partition naming the errno and the file, no traceback, no temporary left behind, no byte changed."""

import json
import os
import shutil
import subprocess
import sys

import pytest

PROBE = os.path.join(os.path.dirname(__file__), "hostile_fs_probe.py")


def _namespaces_work() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces_work(), reason="needs unprivileged user+mount namespaces")


def probe(scenario, tmp_path):
    r = subprocess.run(
        ["unshare", "-rm", sys.executable, PROBE, scenario, str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _lines(out):
    return [json.loads(line) for line in out["stdout"].splitlines() if line.startswith("{")]


def test_full_disk_leaves_no_temporary_and_says_enospc(tmp_path):
    out = probe("full", tmp_path)
    c = out["compact"]
    assert c["rc"] == 1 and "Traceback" not in c["stderr"], c["stderr"][-3000:]
    failed = [r for r in _lines(c) if r["status"] == "failed"]
    assert failed and all(r["error"].startswith("ENOSPC: No space left on device") for r in failed)
    assert out["temps_left"] == [] and out["unchanged"]


def test_a_full_disk_during_the_key_spill_fails_cleanly_and_changes_nothing(tmp_path):
    """Compaction past its key budget spills key records beside the data: on a full disk the partition fails with
    ENOSPC naming the spill, nothing is changed, no spill file is left, and with room again it compacts."""
    out = probe("spill", tmp_path)
    c = out["compact"]
    assert c["rc"] == 1 and "Traceback" not in c["stderr"], c["stderr"][-3000:]
    (failed,) = [r for r in _lines(c) if r["status"] == "failed"]
    assert failed["error"].startswith("ENOSPC: no space left for the key spill"), failed["error"]
    assert ".compaction-spill-" in failed["error"]
    assert out["temps_left"] == [] and out["unchanged"]
    again = [r for r in _lines(out["again"]) if r.get("status")]
    assert out["again"]["rc"] == 0 and [r["status"] for r in again] == ["compacted"], out["again"]
    assert again[0]["spill_buckets"] > 1
    assert out["verify"]["rc"] == 0


def test_read_only_filesystem_is_reported_not_a_crash(tmp_path):
    out = probe("ro", tmp_path)
    rep, comp = out["repair"], out["compact"]
    assert rep["rc"] == 1 and "Traceback" not in rep["stderr"], rep["stderr"][-3000:]
    assert {r["action"] for r in _lines(rep)} == {"failed"}
    assert all(r["reason"].startswith("EROFS: Read-only file system") for r in _lines(rep))
    assert comp["rc"] == 1 and "Traceback" not in comp["stderr"], comp["stderr"][-3000:]
    failed = [r for r in _lines(comp) if r["status"] == "failed"]
    assert failed and all("EROFS" in r["error"] for r in failed)
    assert out["verify"]["rc"] == 0 and out["unchanged"]
