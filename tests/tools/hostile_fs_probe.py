"""Run inside `unshare -rm` (a private mount namespace): put data on a real tmpfs that is full or read-only, run
`tank-log` on it and print what happened as JSON (the test asserts on it). Usage: probe.py full|ro|spill WORKDIR

full: the demo data, 12 KiB left: compaction outputs do not fit. ro: the demo data, remounted read-only.
spill: one partition whose keys exceed the key budget, with room for the compaction's outputs but not its key
spill."""

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


def many_keys(base):
    """One cleanup partition: an RO segment of 200,000 messages over 20,000 keys of 40 bytes, values of 1 byte (the
    key records past a small budget, ~9 MB, are far larger than the compacted output, <1 MB), one active message."""
    from tank_log.format.bundle import Message
    from tank_log.storage.partition_writer import write_partition
    from tank_log.storage.writer import SegmentWriter

    msgs = (Message(i + 1, 1_700_000_000_000 + i, b"key-%036d" % (i * 7919 % 20_000), b"v") for i in range(200_000))
    part = os.path.join(base, "kv", "0")
    write_partition(part, msgs, segment_bytes=4 << 20, with_active=False)
    with SegmentWriter(part, active=True) as w:
        w.add(Message(200_001, 1_700_000_200_000, b"key-0", b"v"))
    with open(os.path.join(base, "kv", "config"), "w") as fh:
        fh.write("log.cleanup.policy=cleanup\n")
    return base


def main(scenario, work):
    src = many_keys(os.path.join(work, "src")) if scenario == "spill" else write_demo(os.path.join(work, "src"))
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m" if scenario == "spill" else "size=4m", "tmpfs", mnt], check=True
    )
    base = shutil.copytree(src, os.path.join(mnt, "demo"))
    out = {}
    if scenario == "full":
        st = os.statvfs(mnt)
        free = st.f_bavail * st.f_frsize
        with open(os.path.join(mnt, "filler"), "wb") as fh:  # leave 12 KiB: compaction outputs do not fit
            fh.write(b"\0" * (free - (12 << 10)))
        before = tree_digest(base)
        out["compact"] = run("compact", base, "--broker-stopped", "--force")
    elif scenario == "spill":
        # the outputs fit in 3 MiB, the key records past a 200 KB budget do not
        conf = os.path.join(work, "budget.yaml")
        with open(conf, "w") as fh:
            fh.write("compaction:\n  key_state_budget: 200kb\n")
        st = os.statvfs(mnt)
        with open(os.path.join(mnt, "filler"), "wb") as fh:
            fh.write(b"\0" * (st.f_bavail * st.f_frsize - (3 << 20)))
        before = tree_digest(base)
        out["compact"] = run("compact", base, "--broker-stopped", "--force", "--config", conf)
        os.unlink(os.path.join(mnt, "filler"))  # with room again, the same run compacts
        out["unchanged"] = tree_digest(base) == before
        out["temps_left"] = our_temps(base)
        out["again"] = run("compact", base, "--broker-stopped", "--force", "--config", conf)
        out["verify"] = run("verify", base)
        print(json.dumps(out))
        return
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
