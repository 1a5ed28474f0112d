"""The import's peak memory against the table's size: does it grow with the table?

A Delta table of N rows (8 topics, `--partitions` partitions each, 16-byte values) written as the export writes
one: files of a fixed size (`--file-rows`, each one Parquet row group), each an append of a seq range of every
partition above the previous one's, so a larger table has more files, not larger ones. It is imported by
jobs/import_delta.py in a child process, in the driver (no Spark), twice: `--dry-run` (the checks and the plan:
every row's key columns are read) and the real import into a fresh base path. The figure is the child's peak RSS
(`ru_maxrss`, from wait4).

Run: python bench/import_memory.py [--rows 1000000,4000000] [--partitions 8] [--file-rows 250000] [--workdir DIR]
     [--pythonpath DIR]
(`--pythonpath`: a copy of other code to measure instead, e.g. the code before a change, put first on the path.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOPICS = 8


def make_table(path: str, rows: int, partitions: int, file_rows: int) -> None:
    """`rows` rows over TOPICS × `partitions` partitions, seqs 1.. in each, in appends of `file_rows` rows: a seq
    range of every partition each."""
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake

    pairs = TOPICS * partitions
    appends = max(1, rows // file_rows)
    per = rows // pairs // appends
    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("seq", pa.int64()),
            ("ts", pa.timestamp("us", "UTC")),
            ("key", pa.binary()),
            ("value", pa.binary()),
        ]
    )
    value = pa.array([b"v" * 16] * per, pa.binary())
    for a in range(appends):
        seq = pa.array(np.arange(a * per + 1, (a + 1) * per + 1, dtype=np.int64))
        ts = pa.array(np.full(per, 1_800_000_000_000_000, dtype=np.int64)).cast(pa.timestamp("us", "UTC"))
        key = pa.nulls(per, pa.binary())
        batches = [
            pa.record_batch(
                [pa.array([f"topic{t}"] * per), pa.array(np.full(per, p, dtype=np.int32)), seq, ts, key, value],
                schema=schema,
            )
            for t in range(TOPICS)
            for p in range(partitions)
        ]
        write_deltalake(path, pa.Table.from_batches(batches, schema), mode="append")


def measure(cmd: list[str], env: dict[str, str]) -> dict[str, float | int]:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)}: exit {proc.returncode}: {err.strip().splitlines()[-1:]}")
    return {
        "peak_rss_mib": round(usage.ru_maxrss / 1024),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "wall_s": round(time.monotonic() - t0, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1000000,4000000")
    ap.add_argument("--partitions", type=int, default=8, help="per topic (8 topics)")
    ap.add_argument("--file-rows", type=int, default=250_000, help="rows per file (one row group)")
    ap.add_argument("--steps", default="dry_run,import", help="dry_run, import or both")
    ap.add_argument("--workdir")
    ap.add_argument("--pythonpath", help="put this first on the child's path (other code to measure)")
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="tank-import-memory-")
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath + os.pathsep + ROOT
    out = []
    for rows in (int(float(r)) for r in args.rows.split(",")):
        table = os.path.join(work, f"table-{rows}-{args.partitions}-{args.file_rows}")
        if not os.path.isdir(table):
            make_table(table, rows, args.partitions, args.file_rows)
        job = [sys.executable, os.path.join(ROOT, "jobs", "import_delta.py"), "--master", "local[2]", "--table", table]
        base = os.path.join(work, f"base-{os.getpid()}")
        shutil.rmtree(base, ignore_errors=True)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(table) for f in fs)
        files = sum(f.endswith(".parquet") for f in os.listdir(table))
        r: dict[str, object] = {"rows": rows, "files": files, "table_mb": round(size / 1e6, 1)}
        if "dry_run" in args.steps.split(","):
            r["dry_run"] = measure([*job, "--data-dir", base, "--dry-run"], env)
        if "import" in args.steps.split(","):
            r["import"] = measure([*job, "--data-dir", base], env)
        shutil.rmtree(base, ignore_errors=True)
        out.append(r)
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
