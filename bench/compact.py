"""Compaction benchmark on the BENCH.md data set (../shared/BENCH.md), beside the real broker's figures.

1. Generates one partition exactly as BENCH.md: 2,052,000 keyed messages over 100,000 keys in 100-message Snappy
   client bundles, ~6 MiB RO segments, plus a small active segment (checks the generator's SHA-256).
2. Compacts it in a fresh process (library, single thread): wall and CPU time, msg/s, MB/s, peak RSS, output size.
3. Runs jobs/compact.py over 8 copies of a smaller partition on local[1] and local[2] (scaling).

With `--against CHECKOUT` (another checkout of tank-log, its compiled core built in place), step 2 instead
compacts the same copy of the partition with this checkout and that one, alternately (A B, then B A), `--ab-rounds`
times each: wall, CPU of the compaction and CPU (user + sys) of the whole process, medians and ranges, and the load
during the runs, for a machine others share (CPU seconds move less with the load than wall seconds).

Run: python bench/compact.py [--workdir DIR] [--skip-scaling] [--against CHECKOUT [--ab-rounds N]]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from common import BUNDLE, bundle_messages, load_average, machine, run_job  # noqa: E402

from tank_log.format.bundle import Message, SnappyPolicy  # noqa: E402
from tank_log.storage.partition_writer import write_partition  # noqa: E402
from tank_log.storage.writer import BundlePolicy, SegmentWriter  # noqa: E402

INPUT_BUNDLES = 20_520  # bundles 0..20519 are the compaction input (BENCH.md)
ACTIVE_BUNDLES = 10
SHA_BUNDLE0 = "a755e60bdf4f09ff6a65e8482e9477b1c9aa0cca51badde8d1b6b70b364373f8"
SHA_INPUT = "832c9e98c72110c6e70920ceb0dd9c3288beb7f93904312d095b4318abcd7e2b"
CLIENT = BundlePolicy(max_messages=BUNDLE, max_bytes=1 << 30, snappy=SnappyPolicy.CLIENT)


def messages(first_bundle: int, last_bundle: int, digest=None):
    for b in range(first_bundle, last_bundle):
        for j, (ts, key, value) in enumerate(bundle_messages(b)):
            if digest is not None:
                digest.update(struct.pack("<QB", ts, len(key)) + key + struct.pack("<I", len(value)) + value)
            yield Message(b * BUNDLE + j + 1, ts, key, value)


def generate(part_dir: str, bundles: int = INPUT_BUNDLES) -> None:
    d0 = hashlib.sha256()
    for _ in messages(0, 1, d0):
        pass
    assert d0.hexdigest() == SHA_BUNDLE0, "generator differs from BENCH.md (bundle 0)"
    digest = hashlib.sha256()
    write_partition(part_dir, messages(0, bundles, digest), segment_bytes=6 << 20, with_active=False, policy=CLIENT)
    if bundles == INPUT_BUNDLES:
        assert digest.hexdigest() == SHA_INPUT, "generator differs from BENCH.md (input)"
    w = SegmentWriter(part_dir, active=True, policy=CLIENT)
    w.add_all(messages(bundles, bundles + ACTIVE_BUNDLES))
    w.close()


def snappy_pass_s(part_dir: str) -> tuple[float, float]:
    """One raw Snappy-decompress pass over the input's message sets with the Snappy library (cramjam, one call per
    set), best of 3: the reference the issue measures compaction against. Returns (wall, CPU) seconds."""
    import cramjam

    from tank_log.storage.datadir import scan_partition

    part = scan_partition(part_dir, "bench", 0)
    blocks = []
    for s in part.ro:
        raw = open(s.path, "rb").read()
        blocks += [raw[h.set_offset : h.end] for h in s.bundles() if h.codec]
    best, best_cpu = float("inf"), float("inf")
    for _ in range(3):
        t0, c0 = time.perf_counter(), time.process_time()
        for b in blocks:
            cramjam.snappy.decompress_raw(b)
        best, best_cpu = min(best, time.perf_counter() - t0), min(best_cpu, time.process_time() - c0)
    return best, best_cpu


def compact_in_subprocess(base: str, pure: bool = False, allocator_setting: bool = True, root: str = ROOT) -> dict:
    """Compact base/bench/0 in a fresh interpreter (on the pure-Python codec core if `pure`), with the allocator
    setting every job task makes (jobs/allocator.py) unless `allocator_setting` is False, with the tank-log of the
    checkout `root`; returns its result + timings + peak RSS + minor page faults + the CPU seconds (user + sys) of
    the whole process, its imports included."""
    code = f"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
if {allocator_setting!r}:
    from tank_log.jobs.allocator import reuse_freed_buffers
    reuse_freed_buffers()
def hwm_kib():  # VmHWM: getrusage's ru_maxrss survives exec and would report the benchmark driver's own peak
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
from tank_log.maintenance.compaction import CompactionOptions, compact_partition
from tank_log.storage.datadir import scan_data_dir
rss0 = hwm_kib()
(part,) = scan_data_dir({base!r}).partitions()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t0, c0 = time.perf_counter(), time.process_time()
res = compact_partition(part, CompactionOptions(force=True, broker_stopped=True), base_path={base!r})
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({{"result": res.to_dict(), "wall_s": wall, "cpu_s": cpu, "rss_before_mib": rss0 / 1024,
                  "peak_rss_mib": hwm_kib() / 1024,
                  "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0}}))
"""
    env = {**os.environ, "TANK_LOG_PURE_PYTHON": "1" if pure else ""}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["process_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return res


def run_compaction(data_dir: str, master: str, *options: str) -> dict:
    """Process wall time, the job's own duration (its report's: from after the imports to the report) and
    Σ per-partition durations."""
    report = os.path.join(os.path.dirname(data_dir), f"report-{master}.json")
    args = ("--data-dir", data_dir, "--broker-stopped", "--force", *options)
    load = load_average()
    wall, rep = run_job("compact", *args, master=master, report=report)
    return {
        "executed_on": rep["executed_on"],
        "load_average": load,
        "process_wall_s": round(wall, 2),
        "job_duration_s": round(rep["duration_s"], 2),
        "timings": rep["timings"],
        "sum_partition_s": round(sum(p["duration_s"] for p in rep["partitions"]), 2),
    }


def eight_copies(small: str, data: str) -> str:
    """`data`, made afresh: a base path whose cleanup topic `bench` holds 8 copies of the partition `small`."""
    shutil.rmtree(data, ignore_errors=True)
    for p in range(8):
        shutil.copytree(small, os.path.join(data, "bench", str(p)))
    with open(os.path.join(data, "bench", "config"), "w") as fh:
        fh.write("log.cleanup.policy=cleanup\n")
    os.sync()  # the copies' writeback does not run during the job
    return data


SCALING_VARIANTS = {"default": (), "executors": ("--in-driver-max-bytes", "0")}  # as operators run it; Spark forced


def scaling(work: str, small: str, rounds: int) -> dict:
    """jobs/compact.py over 8 copies of the partition `small`, on local[1] and local[2], as operators run it (this
    size runs in the driver's processes) and forced onto Spark's executors; alternating, `rounds` times."""
    runs: dict[str, dict[str, list[dict]]] = {v: {"local[1]": [], "local[2]": []} for v in SCALING_VARIANTS}
    for _ in range(rounds):
        for variant, options in SCALING_VARIANTS.items():
            for master in ("local[1]", "local[2]"):
                data = eight_copies(small, os.path.join(work, f"scaling-{master}"))
                runs[variant][master].append(run_compaction(data, master, *options))
                shutil.rmtree(data, ignore_errors=True)
    out: dict = {"partitions": 8}
    for variant, by_master in runs.items():
        ratios = [
            round(two["job_duration_s"] / one["job_duration_s"], 2)
            for one, two in zip(by_master["local[1]"], by_master["local[2]"], strict=True)
        ]
        process_ratios = [
            round(two["process_wall_s"] / one["process_wall_s"], 2)
            for one, two in zip(by_master["local[1]"], by_master["local[2]"], strict=True)
        ]
        out[variant] = {**by_master, "local[2]/local[1]": ratios, "local[2]/local[1], process": process_ratios}
    return out


def cli(work: str, small: str, rounds: int) -> dict:
    """`tank-log compact` over the same 8 partitions: one process, and one per CPU (the default), alternating."""
    variants = {"one process": ["--processes", "1"], "default": []}
    runs: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for variant, options in variants.items():
            data = eight_copies(small, os.path.join(work, "cli"))
            cmd = [sys.executable, "-m", "tank_log.tools.cli", "compact", data, "--broker-stopped", "--force"]
            t0 = time.perf_counter()
            subprocess.run([*cmd, *options], capture_output=True, check=True)
            runs[variant].append(round(time.perf_counter() - t0, 2))
            shutil.rmtree(data, ignore_errors=True)
    return {"process_wall_s": runs}


def library_compaction(work: str, base: str, pdir: str, in_bytes: int) -> dict:
    """The partition compacted by the library in fresh processes (compiled core, pure Python, glibc's default
    allocator), alternating with a raw Snappy pass over its message sets."""
    out: dict = {}
    runs, pure_runs, snappy_runs, snappy_cpu_runs, plain_alloc_runs = [], [], [], [], []
    loads = [load_average()]
    # alternating: the compiled core, a raw Snappy pass, the pure-Python core, the compiled core without the jobs'
    # allocator setting
    for _ in range(3):
        for variant, into in (("compiled", runs), ("pure", pure_runs), ("glibc default", plain_alloc_runs)):
            work_copy = os.path.join(work, "run")
            shutil.rmtree(work_copy, ignore_errors=True)
            shutil.copytree(base, work_copy)
            os.sync()  # the copy's writeback does not run during the compaction
            into.append(
                compact_in_subprocess(work_copy, variant == "pure", allocator_setting=into is not plain_alloc_runs)
            )
            if variant == "compiled":
                wall, cpu = snappy_pass_s(pdir)
                snappy_runs.append(wall)
                snappy_cpu_runs.append(cpu)
                into[-1]["over_snappy_pass_cpu"] = into[-1]["cpu_s"] / cpu  # the same round
            loads.append(load_average())
    runs.sort(key=lambda r: r["wall_s"])
    pure_runs.sort(key=lambda r: r["wall_s"])
    plain_alloc_runs.sort(key=lambda r: r["wall_s"])
    snappy_s = sorted(snappy_runs)[1]
    out["load_average"] = {"min": min(loads), "max": max(loads)}
    out["snappy_pass_s"] = {
        "median": round(snappy_s, 3),
        "all": [round(x, 3) for x in snappy_runs],
        "cpu_all": [round(x, 3) for x in snappy_cpu_runs],
    }
    out["pure_python_compaction"] = {
        "wall_s": round(pure_runs[1]["wall_s"], 2),
        "all_wall_s": [round(r["wall_s"], 2) for r in pure_runs],
        "peak_rss_mib": round(pure_runs[1]["peak_rss_mib"]),
        "over_snappy_pass": round(pure_runs[1]["wall_s"] / snappy_s, 2),
    }
    best = runs[len(runs) // 2]  # median of 3
    res = best["result"]
    out["compaction"] = {
        "wall_s": round(best["wall_s"], 2),
        "cpu_s": round(best["cpu_s"], 2),
        "all_wall_s": [round(r["wall_s"], 2) for r in runs],
        "over_snappy_pass": round(best["wall_s"] / snappy_s, 2),
        "over_snappy_pass_cpu_same_round": sorted(round(r["over_snappy_pass_cpu"], 2) for r in runs),
        "msgs_per_s": round(res["messages_before"] / best["wall_s"]),
        "mb_per_s": round(in_bytes / best["wall_s"] / 1e6, 1),
        "peak_rss_mib": round(best["peak_rss_mib"]),
        "rss_after_imports_mib": round(best["rss_before_mib"]),
        "minor_faults": best["minor_faults"],
        "messages_after": res["messages_after"],
        "bytes_after": res["bytes_after"],
        "bytes_per_msg_after": round(res["bytes_after"] / res["messages_after"], 1),
        "output_segments": res["segments_after"],
        "distinct_keys": res["distinct_keys"],
        "key_state_bytes": res["key_state_bytes"],
        "key_state_bytes_per_key": round(res["key_state_bytes"] / res["distinct_keys"], 1),
    }
    plain = plain_alloc_runs[1]
    out["compaction_with_glibc_default_allocator_setting"] = {
        "wall_s": round(plain["wall_s"], 2),
        "all_wall_s": [round(r["wall_s"], 2) for r in plain_alloc_runs],
        "over_snappy_pass": round(plain["wall_s"] / snappy_s, 2),
        "minor_faults": plain["minor_faults"],
        "peak_rss_mib": round(plain["peak_rss_mib"]),
    }
    return out


def against(work: str, base: str, other: str, rounds: int) -> dict:
    """The partition compacted with this checkout (A) and with `other` (B) in fresh processes, alternately (A B,
    then B A), `rounds` times each, each run on a fresh copy of the same input: medians and ranges of the wall and
    CPU seconds of the compaction and the CPU seconds of the whole process, B over A by the medians."""
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    roots = {"A": ROOT, "B": os.path.abspath(other)}
    loads = [load_average()]
    for i in range(rounds):
        for variant in ("A", "B") if i % 2 == 0 else ("B", "A"):
            work_copy = os.path.join(work, "run")
            shutil.rmtree(work_copy, ignore_errors=True)
            shutil.copytree(base, work_copy)
            os.sync()  # the copy's writeback does not run during the compaction
            runs[variant].append(compact_in_subprocess(work_copy, root=roots[variant]))
            loads.append(load_average())
    out: dict = {
        "A": roots["A"],
        "B": roots["B"],
        "rounds": rounds,
        "load_average": {"min": min(loads), "max": max(loads)},
    }
    for key in ("wall_s", "cpu_s", "process_cpu_s"):
        figures = {v: [r[key] for r in rs] for v, rs in runs.items()}
        medians = {v: statistics.median(xs) for v, xs in figures.items()}
        out[key] = {
            **{
                v: {"median": round(medians[v], 3), "range": [round(min(xs), 3), round(max(xs), 3)]}
                for v, xs in figures.items()
            },
            "B/A": round(medians["B"] / medians["A"], 3),
        }
    results = {(r["result"]["messages_after"], r["result"]["bytes_after"]) for rs in runs.values() for r in rs}
    out["same_output"] = len(results) == 1  # messages and bytes after: both checkouts compact alike
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir")
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--scaling-bundles", type=int, default=INPUT_BUNDLES, help="bundles per partition (scaling)")
    ap.add_argument("--scaling-only", action="store_true", help="only the jobs over 8 partitions")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the scaling runs")
    ap.add_argument("--against", metavar="CHECKOUT", help="compare with another checkout's compaction (A/B)")
    ap.add_argument("--ab-rounds", type=int, default=6, help="runs of each checkout with --against")
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="tank-compact-")
    out: dict = {"machine": machine()}

    base = os.path.join(work, "bench-data")
    pdir = os.path.join(base, "bench", "0")
    shutil.rmtree(base, ignore_errors=True)
    t0 = time.perf_counter()
    generate(pdir)
    out["generate_s"] = round(time.perf_counter() - t0, 1)
    ro = [f for f in os.listdir(pdir) if f.endswith(".ilog")]
    in_bytes = sum(os.path.getsize(os.path.join(pdir, f)) for f in ro)
    out["input"] = {
        "ro_segments": len(ro),
        "bytes": in_bytes,
        "messages": INPUT_BUNDLES * BUNDLE,
        "bytes_per_msg": round(in_bytes / (INPUT_BUNDLES * BUNDLE), 1),
    }
    if args.against:
        out["against"] = against(work, base, args.against, args.ab_rounds)
    elif not args.scaling_only:
        out.update(library_compaction(work, base, pdir, in_bytes))
        print(json.dumps(out, indent=2), flush=True)

    if not args.skip_scaling:
        small = pdir
        if args.scaling_bundles != INPUT_BUNDLES:
            small = os.path.join(work, "scaling-src", "bench", "0")
            shutil.rmtree(os.path.dirname(os.path.dirname(small)), ignore_errors=True)
            generate(small, args.scaling_bundles)
        out["scaling"] = {"messages_per_partition": args.scaling_bundles * BUNDLE, **scaling(work, small, args.rounds)}
        out["cli_8_partitions"] = cli(work, small, args.rounds)
    print(json.dumps(out, indent=2))
    with open(os.path.join(work, "compact-results.json"), "w") as fh:
        json.dump(out, fh, indent=2)
    print(
        f"peak RSS of this driver process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
