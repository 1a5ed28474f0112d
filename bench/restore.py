"""Restore benchmark: N messages over P partitions (the BENCH.md generator) exported to Delta by jobs/export_delta.py,
then imported into a new base path by jobs/import_delta.py — in the driver (default settings) and on Spark's
executors (`--in-driver-max-bytes 0`) — beside the library's column writer (`PartitionWriter.add_columns`) writing
the same rows, already in memory and sorted, in the same run. Reports each import's job time (`import_s`), process
wall time, peak RSS (the job's largest process, JVM included when it starts one), messages/s and the ratio to the
column writer; checks that `tank-log dump` of every imported base path equals the original's (SHA-256 of the
lines).

Run: python bench/restore.py [--messages 10000000] [--partitions 8] [--runs 1] [--where driver,executors]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
from common import load_average, machine, run_job  # noqa: E402
from export import generate  # noqa: E402

from tank_log.format.arrow import columns_from_arrow  # noqa: E402
from tank_log.storage.partition_writer import PartitionWriter  # noqa: E402

SEGMENT_BYTES = 64 << 20  # the generator's, the import's (--segment-bytes) and the column writer's
FLAGS = {"driver": [], "executors": ["--in-driver-max-bytes", "0"]}


def dump_digest(base: str) -> tuple[str, int]:
    """(SHA-256, line count) of `tank-log dump BASE`, streamed."""
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "tank-log"), "dump", base], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    digest, lines = hashlib.sha256(), 0
    for chunk in iter(lambda: proc.stdout.read(1 << 20), b""):
        digest.update(chunk)
        lines += chunk.count(b"\n")
    assert proc.wait() == 0, f"tank-log dump {base} failed"
    return digest.hexdigest(), lines


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed_job(job: str, *args: str, report: str) -> tuple[float, float, float, dict]:
    """Run jobs/<job>.py on local[2]: (process wall s, CPU s of it and the children it waited for, peak RSS MiB of
    its largest process, its report)."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    cmd = [sys.executable, os.path.join(ROOT, "jobs", f"{job}.py"), "--master", "local[2]", *args, "--report", report]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, err.decode()[-3000:]
    with open(report) as fh:
        return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, json.load(fh)


def column_writer(table: str, out: str, partitions: int) -> tuple[float, float]:
    """The library's column writer over each partition's rows (read and sorted before the clock starts): (wall s,
    CPU s)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    dataset = DeltaTable(table).to_pyarrow_dataset()
    total = cpu = 0.0
    for p in range(partitions):
        rows = dataset.to_table(filter=pc.field("partition") == p, columns=["seq", "ts", "key", "value"])
        batches = rows.sort_by("seq").to_batches(max_chunksize=64 * 1024)
        del rows
        t0, c0 = time.perf_counter(), cpu_s()
        w = PartitionWriter(os.path.join(out, "bench", str(p)), segment_bytes=SEGMENT_BYTES)
        for b in batches:
            seq = b.column("seq").to_numpy().view(np.uint64)
            ms = np.floor_divide(b.column("ts").cast(pa.int64()).to_numpy(), 1000).astype(np.uint64)
            w.add_columns(columns_from_arrow(seq, ms, b.column("key"), b.column("value")))
        w.finish()
        total += time.perf_counter() - t0
        cpu += cpu_s() - c0
        del batches
    return total, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--where", default="driver,executors", help="where the import runs: driver, executors or both")
    ap.add_argument("--workdir")
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="tank-restore-")
    base, table = os.path.join(work, "data"), os.path.join(work, "table")
    for p in (base, table):
        shutil.rmtree(p, ignore_errors=True)
    generate(base, args.messages, args.partitions)
    run_job("export_delta", "--data-dir", base, "--table", table, report=os.path.join(work, "export.json"))
    original = dump_digest(base)
    runs = []
    for r in range(args.runs):
        for where in args.where.split(","):
            written = os.path.join(work, "written")
            shutil.rmtree(written, ignore_errors=True)
            reference, reference_cpu = column_writer(table, written, args.partitions)
            shutil.rmtree(written)
            restored = os.path.join(work, f"restored-{where}")
            shutil.rmtree(restored, ignore_errors=True)
            load = load_average()
            wall, cpu, rss, rep = timed_job(
                "import_delta",
                "--data-dir",
                restored,
                "--table",
                table,
                "--segment-bytes",
                str(SEGMENT_BYTES),
                *FLAGS[where],
                report=os.path.join(work, "import.json"),
            )
            s = rep["summary"]
            assert s["executed_on"] == where and s["rows"] == original[1], s
            assert dump_digest(restored) == original, f"{where}: the restored dump differs from the original's"
            shutil.rmtree(restored)
            runs.append(
                {
                    "run": r + 1,
                    "where": where,
                    "load_average": load,
                    "import_job_s": s["import_s"],
                    "process_wall_s": round(wall, 2),
                    "process_cpu_s": round(cpu, 2),
                    "peak_rss_mib": round(rss),
                    "messages_per_s_job": round(s["rows"] / s["import_s"]),
                    "column_writer_s": round(reference, 2),
                    "column_writer_cpu_s": round(reference_cpu, 2),
                    "ratio_job_vs_column_writer": round(s["import_s"] / reference, 2),
                    "ratio_process_vs_column_writer": round(wall / reference, 2),
                    "ratio_process_cpu_vs_column_writer_cpu": round(cpu / reference_cpu, 2),
                    "dump_equal": True,
                }
            )
            print(json.dumps(runs[-1]), flush=True)
    print(
        json.dumps(
            {"machine": machine(), "messages": original[1], "partitions": args.partitions, "runs": runs}, indent=2
        )
    )


if __name__ == "__main__":
    main()
