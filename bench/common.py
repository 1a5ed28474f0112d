"""Helpers shared by the benchmarks: the BENCH.md message generator, timing, peak RSS, running a job."""

from __future__ import annotations

import json
import os
import platform
import random
import resource
import subprocess
import sys
import time

SEED = 2026
NKEYS = 100_000
BUNDLE = 100
TS0 = 1_776_000_000_000
WORDS = (
    "amber azure beige black blue bronze brown coral cream crimson cyan gold green grey indigo ivory "
    "jade khaki lemon lilac lime magenta maroon mint navy olive orange peach pink plum purple red"
).split()


def bundle_messages(b: int) -> list[tuple[int, bytes, bytes]]:
    """Messages of bundle number b (0-based), exactly as ../shared/BENCH.md: (ts_ms, key, value)."""
    r = random.Random(SEED * 1_000_003 + b)
    out = []
    for j in range(BUNDLE):
        i = b * BUNDLE + j
        k = r.randrange(NKEYS)
        key = b"user:%06d" % k
        val = '{"id":%d,"i":%d,"name":"%s-%s","amount":%.2f,"flags":"%s","note":"' % (  # noqa: UP031 (verbatim BENCH.md)
            k,
            i,
            r.choice(WORDS),
            r.choice(WORDS),
            r.random() * 10000,
            "".join(r.choice("abcdef") for _ in range(8)),
        )
        while len(val) < 100:
            val += r.choice(WORDS) + " "
        out.append((TS0 + i, key, val[:100].encode()))
    return out


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def load_average() -> float:
    """The machine's 1-minute load average: every benchmark reports it beside its figures (the machine is shared)."""
    return round(os.getloadavg()[0], 1)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Timer:
    def __enter__(self):
        self.wall0 = time.perf_counter()
        self.cpu0 = time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_job(job: str, *args: str, master: str = "local[2]", report: str | None = None) -> tuple[float, dict | None]:
    """Run jobs/<job>.py on local Spark (loopback): its process wall time in seconds and, with `report`, the JSON
    report it wrote there. A failing job stops the benchmark with its stderr."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    cmd = [sys.executable, os.path.join(ROOT, "jobs", f"{job}.py"), "--master", master, *args]
    t0 = time.perf_counter()
    r = subprocess.run([*cmd, *(["--report", report] if report else [])], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{job} failed ({r.returncode}): {r.stderr[-2000:]}")
    if report is None:
        return wall, None
    with open(report) as fh:
        return wall, json.load(fh)
