"""A broker host's worth: how the nightly work grows with the data.

A synthetic base path (the BENCH.md generator) at several sizes, a fixed size per partition (so the partitions grow
with the data): keyed `cleanup` topics and `delete` topics with a retention limit (`log.retention.bytes`), written
with the library's writer. Each size then goes through, as real processes, timed one after the other:

- `maintain_cli`: `tank-log maintain --broker-stopped BASE` (repair, retention, compaction, indexes, verify);
- `maintain_job`: jobs/maintain.py --broker-stopped on a copy of the same base path, in the driver;
- `maintain_executors`: the same job on another copy with `--in-driver-max-bytes 0`, on Spark's executors at every
  size (the default switches from the driver to the executors past 1 GiB: each path's growth needs both sizes on it);
- `export_delta` and `export_iceberg`: jobs/export_delta.py of the maintained base path (default settings);
- `import_delta`: jobs/import_delta.py of the Delta table into a fresh base path;
- `import_executors`: the same with `--in-driver-max-bytes 0`, into another fresh base path;
- `audit`: `tank-log audit --table DELTA BASE`.

Per size and step: wall; CPU (user+sys of the whole tree: RUSAGE_CHILDREN, this process being the tree's
subreaper, so Spark's orphaned JVM counts); peak RSS (VmHWM of every process of the tree, polled: the largest and
whose, and the step's own process's: the driver); bytes read and written (this process's /proc/self/io, where every
reaped process's bytes end up); files in the table; seconds per GB and per partition; the growth: a step's s/GB over
the smallest size's. The load average is read before each step and sampled every second during it (min, mean, max).

Run: python bench/host_scale.py [--sizes 0.25,1,4] [--partition-mb 2.5] [--steps ...] [--workdir DIR]
     python bench/host_scale.py --partitions 2000 --steps export_delta,audit   (many small partitions)
     python bench/host_scale.py --short      (a few MB over ~20 partitions: the suite's check that it still works)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from common import BUNDLE, bundle_messages, load_average, machine  # noqa: E402

from tank_log.format.bundle import Message, SnappyPolicy  # noqa: E402
from tank_log.storage.partition_writer import write_partition  # noqa: E402
from tank_log.storage.writer import BundlePolicy  # noqa: E402

CLIENT = BundlePolicy(max_messages=BUNDLE, max_bytes=1 << 30, snappy=SnappyPolicy.CLIENT)
MIB = 1 << 20
GB = 1e9
STEPS = (
    "maintain_cli",
    "maintain_job",
    "maintain_executors",
    "export_delta",
    "export_iceberg",
    "import_delta",
    "import_executors",
    "audit",
)
ON_EXECUTORS = ("maintain_executors", "import_executors")  # Spark at every size: not in --short (a few seconds)
TEMPLATES = 4  # distinct partitions per topic kind; the others are copies of them (generating is the slow part)


# -- the data ---------------------------------------------------------------------------------------------------------


def write_template(directory: str, first_bundle: int, bundles: int, segment_bytes: int) -> None:
    def msgs():
        for b in range(bundles):
            for j, (ts, key, value) in enumerate(bundle_messages(first_bundle + b)):
                yield Message(b * BUNDLE + j + 1, ts, key, value)

    write_partition(directory, msgs(), segment_bytes=segment_bytes, policy=CLIENT)


def du(path: str) -> tuple[int, int]:
    """(bytes, files) under path."""
    size = files = 0
    for r, _, fs in os.walk(path):
        for f in fs:
            size += os.path.getsize(os.path.join(r, f))
            files += 1
    return size, files


def make_host(
    base: str,
    size_gb: float,
    partition_mb: float,
    topics: int,
    segment_bytes: int,
    cache: str,
    partitions: int | None = None,
) -> dict:
    """A base path of about `size_gb` GB (or of `partitions` partitions): `topics` topics (half `cleanup`, half
    `delete` with a retention limit of about half a partition), partitions of about `partition_mb` MiB, copies of a
    few generated template partitions."""
    bundles = max(2, int(partition_mb * MIB / (52 * BUNDLE)))  # BENCH.md: 52 B/msg on disk
    key = f"{bundles}-{segment_bytes}"
    templates = os.path.join(cache, key)
    if not os.path.isdir(templates):
        tmp = templates + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        for t in range(TEMPLATES):
            write_template(os.path.join(tmp, str(t)), t * bundles, bundles, segment_bytes)
        os.rename(tmp, templates)
    part_bytes = du(os.path.join(templates, "0"))[0]
    partitions = partitions or max(topics, round(size_gb * GB / part_bytes))
    per_topic = [partitions // topics + (1 if i < partitions % topics else 0) for i in range(topics)]
    shutil.rmtree(base, ignore_errors=True)
    for i, n in enumerate(per_topic):
        policy = "cleanup" if i % 2 == 0 else "delete"
        tdir = os.path.join(base, f"{policy}{i}")
        for p in range(n):
            shutil.copytree(os.path.join(templates, str(p % TEMPLATES)), os.path.join(tdir, str(p)))
        with open(os.path.join(tdir, "config"), "w") as fh:
            fh.write(f"log.cleanup.policy={policy}\n")
            if policy == "delete":
                fh.write(f"log.retention.bytes={max(128, part_bytes // 2)}\n")
    os.sync()
    size, files = du(base)
    return {"partitions": partitions, "topics": topics, "bytes": size, "files": files, "partition_bytes": part_bytes}


# -- measuring a process tree -----------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(c) for c in fh.read().split())
    except OSError:
        pass
    return out


def _tree(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(_children(p))
    return seen


def _status_kib(pid: int, field_name: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field_name):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read().split(b"\0")
        name = os.path.basename(args[0].decode(errors="replace"))
        if name.startswith("python") and len(args) > 1:
            name += " " + os.path.basename(args[1].decode(errors="replace"))
        return name
    except OSError:
        return "?"


def _io(pid: int) -> dict[str, int]:
    try:
        with open(f"/proc/{pid}/io") as fh:
            return {k: int(v) for k, v in (line.split(":") for line in fh)}
    except OSError:
        return {}


@dataclass
class Watch:
    """Polls a process tree's VmHWM until stopped: the largest peak and whose it was."""

    pid: int
    peaks: dict[int, tuple[int, str]] = field(default_factory=dict)
    cpu_ticks: dict[int, int] = field(default_factory=dict)  # each process's own user+sys, last seen
    loads: list[float] = field(default_factory=list)  # the 1-minute load average, every second
    done: threading.Event = field(default_factory=threading.Event)

    def poll(self) -> None:
        for p in _tree(self.pid):
            try:
                with open(f"/proc/{p}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                self.cpu_ticks[p] = int(fields[11]) + int(fields[12])  # utime, stime: its own, not its children's
            except (OSError, IndexError, ValueError):
                pass
            hwm = _status_kib(p, "VmHWM:")
            if hwm and hwm > self.peaks.get(p, (0, ""))[0]:
                self.peaks[p] = (hwm, _comm(p))  # read again: a launcher script execs the JVM

    def run(self) -> None:
        polls = 0
        while not self.done.wait(0.1):
            self.poll()
            if polls % 10 == 0:
                self.loads.append(os.getloadavg()[0])
            polls += 1


def _subreaper() -> None:
    """Make this process the reaper of its orphaned descendants (Spark's JVM outlives the driver that started it):
    reaping them adds their CPU to RUSAGE_CHILDREN and their I/O to this process's /proc/self/io."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _reap_orphans(deadline_s: float) -> None:
    """Wait for the descendants reparented to us (they end once their driver has gone)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def run_step(cmd: list[str], env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)) -> dict:
    """Run cmd as a process: wall, CPU and bytes read and written by its whole tree (its orphans reaped here), the
    peak RSS of every process of it, its exit code."""
    load = load_average()
    _subreaper()
    io0, ru0 = _io(os.getpid()), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    watch = Watch(proc.pid)
    th = threading.Thread(target=watch.run, daemon=True)
    th.start()
    chunks: dict[str, bytes] = {}

    def drain(name: str, stream: Any) -> None:
        chunks[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n, s)) for n, s in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    _, status, _ = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    watch.done.set()
    th.join()
    _reap_orphans(60.0)
    for r in readers:
        r.join()
    io1, ru1 = _io(os.getpid()), resource.getrusage(resource.RUSAGE_CHILDREN)
    out, err = chunks.get("out", b""), chunks.get("err", b"")
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.decode(errors='replace')[-3000:]}")
    peak_kib, peak_of = max(watch.peaks.values(), default=(ru1.ru_maxrss, "?"))
    loads = watch.loads or [load]
    polled = sum(watch.cpu_ticks.values()) / os.sysconf("SC_CLK_TCK")
    return {
        "load_average": load,
        "load_during": [round(min(loads), 1), round(sum(loads) / len(loads), 1), round(max(loads), 1)],
        "wall_s": round(wall, 2),
        # the larger of the reaped tree's and the sum of what each process was last seen to have used: processes
        # whose parent ignores SIGCHLD (Spark's Python workers) are reaped without adding to anyone's
        "cpu_s": round(max(ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime, polled), 2),
        "cpu_reaped_s": round(ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime, 2),
        "cpu_polled_s": round(polled, 2),
        "peak_rss_mib": round(peak_kib / 1024, 1),
        "peak_rss_of": peak_of,
        "driver_rss_mib": round(watch.peaks.get(proc.pid, (0, ""))[0] / 1024, 1),  # the step's own process
        "processes": len(watch.peaks),
        "read_mb": round((io1.get("read_bytes", 0) - io0.get("read_bytes", 0)) / 1e6, 1),
        "written_mb": round((io1.get("write_bytes", 0) - io0.get("write_bytes", 0)) / 1e6, 1),
        "exit": proc.returncode,
        "stdout": out.decode(errors="replace"),
    }


def job(name: str, *args: str) -> list[str]:
    return [sys.executable, os.path.join(ROOT, "jobs", f"{name}.py"), "--master", "local[2]", *args]


def tank_log(*args: str) -> list[str]:
    return [os.path.join(os.path.dirname(sys.executable), "tank-log"), *args]


def table_files(table: str) -> int:
    return sum(1 for _, _, fs in os.walk(table) for f in fs if f.endswith(".parquet"))


# -- one size ---------------------------------------------------------------------------------------------------------


def one_size(work: str, size_gb: float, args: argparse.Namespace) -> dict:
    d = os.path.join(work, f"size-{size_gb:g}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    base, copy, copy2 = (os.path.join(d, n) for n in ("base", "base-job", "base-executors"))
    t0 = time.perf_counter()
    cache = os.path.join(work, "cache")
    host = make_host(base, size_gb, args.partition_mb, args.topics, args.segment_bytes, cache, args.partitions)
    host["write_s"] = round(time.perf_counter() - t0, 1)
    steps = args.steps.split(",")
    for name, path in (("maintain_job", copy), ("maintain_executors", copy2)):
        if name in steps:
            shutil.copytree(base, path)
    os.sync()
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    delta, iceberg, restored, restored2 = (os.path.join(d, n) for n in ("delta", "iceberg", "restored", "restored2"))
    spark_only = ("--in-driver-max-bytes", "0")
    out: dict[str, dict] = {}

    def step(name: str, cmd: list[str], table: str | None = None, ok: tuple[int, ...] = (0,)) -> None:
        if name not in steps:
            return
        r = run_step(cmd, env, ok)
        r.pop("stdout")
        if table:
            r["table_files"] = table_files(table)
            r["table_mb"] = round(du(table)[0] / 1e6, 1)
        if "--report" in cmd:  # a job: where it ran (the driver, or Spark's executors past in_driver_max_bytes)
            with open(cmd[cmd.index("--report") + 1]) as fh:
                report = json.load(fh)
            r["executed_on"] = (report.get("summary") or {}).get("executed_on") or report.get("executed_on")
        out[name] = r
        print(json.dumps({"size_gb": size_gb, "step": name, **r}), flush=True)

    step("maintain_cli", tank_log("maintain", "--broker-stopped", base))
    rep = os.path.join(d, "report-")
    step("maintain_job", job("maintain", "--data-dir", copy, "--broker-stopped", "--report", rep + "maintain.json"))
    step(
        "maintain_executors",
        job("maintain", "--data-dir", copy2, "--broker-stopped", *spark_only, "--report", rep + "maintain-ex.json"),
    )
    step(
        "export_delta", job("export_delta", "--data-dir", base, "--table", delta, "--report", rep + "delta.json"), delta
    )
    step(
        "export_iceberg",
        job(
            "export_delta", "--data-dir", base, "--table", iceberg, "--format", "iceberg", "--report", rep + "ice.json"
        ),
        iceberg,
    )
    step("import_delta", job("import_delta", "--data-dir", restored, "--table", delta, "--report", rep + "import.json"))
    step(
        "import_executors",
        job("import_delta", "--data-dir", restored2, "--table", delta, *spark_only, "--report", rep + "import-ex.json"),
    )
    step("audit", tank_log("audit", "--table", delta, "--json", base))
    after = du(base)
    host["bytes_after_maintain"] = after[0]
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)
    return {"size_gb": size_gb, "host": host, "steps": out}


def growth(sizes: list[dict]) -> None:
    """Add s/GB, s/partition and the growth (s/GB over the smallest size's) to every step of every size; from the
    third size on, the marginal growth too: the CPU per GB added since the size before, over that added from the
    first to the second (fixed costs, such as Spark's start, cancel out of it: above 1 is super-linear)."""
    first = sizes[0]
    for i, s in enumerate(sizes):
        gb, parts = s["host"]["bytes"] / GB, s["host"]["partitions"]
        for name, r in s["steps"].items():
            r["s_per_gb"] = round(r["wall_s"] / gb, 2)
            r["ms_per_partition"] = round(1000 * r["wall_s"] / parts, 1)
            r["cpu_s_per_gb"] = round(r["cpu_s"] / gb, 2)
            base = first["steps"].get(name)
            if base:
                r["growth"] = round(r["s_per_gb"] / base["s_per_gb"], 2) if base["s_per_gb"] else None
                r["cpu_growth"] = round(r["cpu_s_per_gb"] / base["cpu_s_per_gb"], 2) if base["cpu_s_per_gb"] else None
            if i >= 2 and all(name in z["steps"] for z in sizes[:i]):
                first_added = _added_cpu_per_gb(sizes[0], sizes[1], name)
                r["cpu_marginal_growth"] = (
                    round(_added_cpu_per_gb(sizes[i - 1], s, name) / first_added, 2) if first_added > 0 else None
                )


def _added_cpu_per_gb(smaller: dict, larger: dict, step: str) -> float:
    """The CPU seconds a step took per GB added from one size to the next."""
    cpu = larger["steps"][step]["cpu_s"] - smaller["steps"][step]["cpu_s"]
    return cpu / ((larger["host"]["bytes"] - smaller["host"]["bytes"]) / GB)


def table(sizes: list[dict]) -> str:
    cols = ("size", "step", "load before", "load during", "wall s", "CPU s", "s/GB", "CPU s/GB", "growth",
            "CPU growth", "marginal", "ms/part", "peak RSS MiB", "peak of", "driver RSS MiB", "read MB", "written MB",
            "table files")  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for s in sizes:
        h = s["host"]
        label = f"{h['bytes'] / GB:.2f} GB / {h['partitions']} p"
        for name, r in s["steps"].items():
            lo, _, hi = r["load_during"]
            row = (label, name, r["load_average"], f"{lo}–{hi}", r["wall_s"], r["cpu_s"], r["s_per_gb"],
                   r["cpu_s_per_gb"], r.get("growth"), r.get("cpu_growth"), r.get("cpu_marginal_growth", ""),
                   r["ms_per_partition"],
                   r["peak_rss_mib"], r["peak_rss_of"], r["driver_rss_mib"], r["read_mb"], r["written_mb"],
                   r.get("table_files", ""))  # fmt: skip
            lines.append("| " + " | ".join(str(x) for x in row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="0.25,1", help="GB, comma-separated, smallest first (default 0.25,1)")
    ap.add_argument("--partition-mb", type=float, default=2.5, help="MiB per partition (default 2.5)")
    ap.add_argument("--segment-bytes", type=int, default=1 << 20, help="log.segment.bytes of the writer (1 MiB)")
    ap.add_argument("--topics", type=int, default=8, help="topics, half cleanup, half delete (default 8)")
    ap.add_argument(
        "--steps",
        default=",".join(STEPS),
        help="comma-separated: " + ",".join(STEPS) + " (--short: all but the last two)",
    )
    ap.add_argument("--workdir", help="default: a new temporary directory, removed at the end")
    ap.add_argument("--keep", action="store_true", help="keep each size's directories")
    ap.add_argument("--short", action="store_true", help="one tiny host (~5 MB, 20 partitions): checks the script runs")
    ap.add_argument(
        "--partitions",
        type=int,
        help="one host of this many partitions of ~10 KB each (--partition-mb 0.01; --sizes is ignored): the costs "
        "that grow with the partitions, not the bytes (e.g. 2000 with --steps export_delta,audit)",
    )
    args = ap.parse_args(argv)
    if args.short:
        args.sizes, args.partition_mb, args.segment_bytes, args.topics = "0.005", 0.25, 64 << 10, 4
        if args.steps == ",".join(STEPS):
            args.steps = ",".join(s for s in STEPS if s not in ON_EXECUTORS)
    if args.partitions:
        args.partition_mb = 0.01 if args.partition_mb == 2.5 else args.partition_mb
        args.sizes = f"{args.partitions * args.partition_mb * MIB / GB:.4f}"  # for the label: the host is counted
    sizes = sorted(float(s) for s in args.sizes.split(","))
    for s in args.steps.split(","):
        if s not in STEPS:
            ap.error(f"--steps: unknown step {s!r} (one of {', '.join(STEPS)})")
    work = args.workdir or tempfile.mkdtemp(prefix="tank-host-scale-")
    try:
        results = [one_size(work, s, args) for s in sizes]
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    growth(results)
    print(table(results))
    print(json.dumps({"machine": machine(), "partition_mb": args.partition_mb, "sizes": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
