"""Run inside `unshare -rm` (a private mount namespace): put demo data on a real tmpfs that is full or read-only,
run `tank-log` on it and print what happened as JSON (the test asserts on it). Usage: probe.py full|ro WORKDIR"""

import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: conftest's helpers
from conftest import tree_digest  # noqa: E402

from tank_log.storage.fsutil import is_our_temp  # noqa: E402
from tank_log.tools.demo import write_demo  # noqa: E402

CLI = [sys.executable, "-m", "tank_log.tools.cli"]


def our_temps(path):
    return sorted(os.path.join(r, n) for r, ds, fs in os.walk(path) for n in fs + ds if is_our_temp(n))


def run(*args):
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)
    return {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr}


def main(scenario, work):
    src = write_demo(os.path.join(work, "src"))
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt], check=True)
    base = shutil.copytree(src, os.path.join(mnt, "demo"))
    out = {}
    if scenario == "full":
        st = os.statvfs(mnt)
        free = st.f_bavail * st.f_frsize
        with open(os.path.join(mnt, "filler"), "wb") as fh:  # leave 12 KiB: compaction outputs do not fit
            fh.write(b"\0" * (free - (12 << 10)))
        before = tree_digest(base)
        out["compact"] = run("compact", base, "--broker-stopped", "--force")
    else:
        part = os.path.join(base, "orders", "0")
        open(os.path.join(part, ".x.tank-log-0123456789ab.tmp"), "w").close()  # repair has work to do
        subprocess.run(["mount", "-o", "remount,ro", mnt], check=True)
        before = tree_digest(base)
        out["repair"] = run("repair", base)
        out["compact"] = run("compact", base, "--broker-stopped", "--force")
        out["verify"] = run("verify", base)
    out["unchanged"] = tree_digest(base) == before
    out["temps_left"] = [p for p in our_temps(base) if scenario == "full"]
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
