"""Hole sweep: no reader passes a hole silently, and the export never records a version past one.

Takes RO segments of the fixtures written by the real broker and damages one at a time — truncated at each bundle
boundary and in the middle of each bundle, each bundle cut out, each bundle duplicated, the segment replaced by a
directory or a FIFO — each damaged partition its own topic of one base path. Then reads every one through
`tank-log dump` and `tank-log stats` (the library calls behind them, exit 1 when they report something unread), the
Delta export (`jobs/export_delta.py`, in the driver and on Spark's executors, `--on-corruption prefix` and `skip`)
and the `tank` Spark data source, and compares what each returned with the undamaged partition:

- a run is a *loss* when it returns fewer messages than the partition claims, or some misnumbered;
- a loss is *silent* unless the run exits non-zero and names a seq range starting at or before the first seq it got
  wrong (`seqs A..B`);
- an export *records past a hole* when its recorded version covers a seq the table does not hold as it was written.

A damage that `verify` does not see either (a sparse bundle cut out after the last index entry: nothing on disk
tells) is counted apart, as `invisible`: no reader can know.

    python bench/hole_sweep.py [--max-per-segment N] [--max-segments N] [--no-spark | --no-source] [--json OUT]
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
FIXTURES = os.path.join(ROOT, "tests", "data", "fixtures")

# partitions with RO segments of every shape: Snappy and plain bundles with varint counts, dense indexes, sparse
# (client-numbered) bundles, compacted sparse + Snappy bundles
PARTITIONS = [
    ("A_multi/data/events/1", "plain"),
    ("A_multi/data/small/0", "dense-index"),
    ("A_multi/data/seqgap/0", "sparse"),
    ("B2_compaction_live/data/kvlive/0", "compacted"),
]
SEQS = re.compile(r"seqs (\d+)\.\.(\d*)")


@dataclass(frozen=True)
class Damage:
    """One damaged copy of a partition: `kind` done to bundle `k` of the RO segment `segment` (a file name)."""

    source: str  # fixture partition, relative to tests/data/fixtures
    segment: str
    kind: str  # trunc-boundary, trunc-mid, cut, dup, dir, fifo; none: undamaged (a reader must return all, exit 0)
    k: int = 0

    @property
    def topic(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", f"{self.source.split('/data/')[1]}-{self.segment[:12]}-{self.kind}-{self.k}")


def damages(max_per_segment: int | None = None, max_segments: int | None = None) -> list[Damage]:
    """Every damage of every RO segment of `PARTITIONS` (the first `max_segments` of each partition); at most
    `max_per_segment` bundle positions per kind and segment (first, last and evenly between: deterministic)."""
    from tank_log.storage.datadir import partitions_at

    out = []
    for source, _ in PARTITIONS:
        (part,) = partitions_at(os.path.join(FIXTURES, source))
        out.append(Damage(source, part.ro[0].file_name, "none"))  # the control: read whole, exit 0
        for seg in part.ro[:max_segments]:
            n = len(list(seg.bundles()))
            ks = list(range(n))
            if max_per_segment is not None and n > max_per_segment:
                step = (n - 1) / max(max_per_segment - 1, 1)
                ks = sorted({round(i * step) for i in range(max_per_segment)})
            for kind in ("trunc-boundary", "trunc-mid", "cut", "dup"):
                out += [Damage(source, seg.file_name, kind, k) for k in ks]
            out += [Damage(source, seg.file_name, kind) for kind in ("dir", "fifo")]
    return out


def apply(d: Damage, base: str) -> str:
    """Write the damaged partition as `<base>/<topic>/0`; returns its path."""
    from tank_log.storage.segment import Segment

    src = os.path.join(FIXTURES, d.source)
    topic_dir = os.path.join(base, d.topic)
    os.makedirs(topic_dir)
    cfg = os.path.join(os.path.dirname(src), "config")
    if os.path.exists(cfg):
        shutil.copyfile(cfg, os.path.join(topic_dir, "config"))
    dst = os.path.join(topic_dir, "0")
    shutil.copytree(src, dst)
    for name in os.listdir(dst):
        os.chmod(os.path.join(dst, name), 0o644)
    path = os.path.join(dst, d.segment)
    if d.kind == "none":
        return dst
    if d.kind in ("dir", "fifo"):
        os.unlink(path)
        os.mkdir(path) if d.kind == "dir" else os.mkfifo(path)
        return dst
    headers = list(Segment(path).bundles())
    h = headers[d.k]
    with open(path, "rb") as fh:
        data = fh.read()
    if d.kind == "trunc-boundary":
        data = data[: h.offset]
    elif d.kind == "trunc-mid":
        data = data[: h.offset + max(h.size // 2, 1)]
    elif d.kind == "cut":
        data = data[: h.offset] + data[h.offset + h.size :]
    elif d.kind == "dup":
        data = data[: h.offset + h.size] + data[h.offset :]
    with open(path, "wb") as fh:
        fh.write(data)
    return dst


Rows = list[tuple[int, bytes]]  # (seq, value in base64) in the order read


def original_rows(source: str) -> Rows:
    from tank_log.tools.dump import dump_path

    return _dump_rows(b"".join(bytes(b) for b in dump_path(os.path.join(FIXTURES, source))))


LINE = re.compile(rb'"seq":(\d+),.*"value_b64":"([^"]*)"')


def _dump_rows(text: bytes) -> Rows:
    """(seq, value as base64) of dump lines (a regex: JSON parsing would take most of the sweep's time)."""
    return [(int(m[1]), m[2]) for m in LINE.finditer(text)]


@dataclass
class Run:
    """What one reader did with one damaged partition."""

    reader: str
    damage: Damage
    rc: int
    message: str
    wrong: list[int]  # seqs returned differently from the undamaged partition (missing, extra or changed)
    first: int | None = None  # the first seq the damage changed (what dump got wrong); else min(wrong)
    recorded: int | None = None  # the export's recorded version
    past_hole: bool = False  # the export recorded a seq the table does not hold as written

    @property
    def loss(self) -> bool:
        return bool(self.wrong)

    @property
    def named(self) -> bool:
        """Exited non-zero naming a seq range that starts at or before the first seq the damage changed."""
        if self.rc == 0:
            return False
        first = self.first if self.first is not None else min(self.wrong)
        return any(int(m.group(1)) <= first for m in SEQS.finditer(self.message))

    @property
    def silent(self) -> bool:
        return self.loss and not self.named


def wrong_seqs(got: Rows, want: Rows) -> list[int]:
    diff = (Counter(got) - Counter(want)) + (Counter(want) - Counter(got))
    return sorted({seq for seq, _ in diff})


def read_dump(path: str) -> tuple[int, str, Rows]:
    from tank_log.storage.datadir import Unread
    from tank_log.tools.dump import dump_path

    unread: list[Unread] = []
    text = b"".join(bytes(b) for b in dump_path(path, unread=unread))  # blocks reuse their buffers
    return (1 if unread else 0), "\n".join(map(str, unread)), _dump_rows(text)


def read_stats(path: str, want: Rows) -> tuple[int, str, bool]:
    """stats returns figures, not rows: wrong when its count or seq range differs from the undamaged partition's."""
    from tank_log.storage.datadir import Unread
    from tank_log.tools.stats import stats_path

    unread: list[Unread] = []
    (row,) = stats_path(path, unread=unread)
    rc = 1 if unread or row.error else 0
    message = "\n".join([*map(str, unread), row.error or ""])
    same = row.messages == len(want) and row.first_seq == want[0][0] and row.last_seq == want[-1][0]
    return rc, message, not same


@dataclass
class Sweep:
    runs: list[Run] = field(default_factory=list)
    invisible: set[str] = field(default_factory=set)  # damages verify does not see either
    first: dict[str, int | None] = field(default_factory=dict)  # topic → the first seq its damage changed (dump)

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "damages": len({r.damage for r in self.runs}),
            "invisible_to_verify": len(self.invisible),
        }
        for reader in sorted({r.reader for r in self.runs}):
            runs = [r for r in self.runs if r.reader == reader]
            silent = [r for r in runs if r.silent]
            out[reader] = {
                "runs": len(runs),
                "losses": sum(r.loss for r in runs),
                "false_alarms": sum(r.rc != 0 and not r.loss for r in runs),
                "exit_0_losses": sum(r.loss and r.rc == 0 for r in runs),
                "silent": sum(r.damage.topic not in self.invisible for r in silent),
                "silent_invisible": sum(r.damage.topic in self.invisible for r in silent),
                "records_past_hole": sum(r.past_hole and r.damage.topic not in self.invisible for r in runs),
                "records_past_hole_invisible": sum(r.past_hole and r.damage.topic in self.invisible for r in runs),
            }
        return out

    def failures(self) -> list[str]:
        """The runs that break the rules (silent losses verify sees, exports past a hole)."""
        return [
            f"{r.reader} {r.damage.topic}: rc {r.rc}, wrong seqs from {r.wrong[0] if r.wrong else '-'}"
            f"{', recorded ' + str(r.recorded) + ' past a hole' if r.past_hole else ''}: {r.message[:300]}"
            for r in self.runs
            if ((r.silent or r.past_hole) and r.damage.topic not in self.invisible) or (r.rc != 0 and not r.loss)
        ]


def sweep_library(cases: list[Damage], base: str, sweep: Sweep) -> dict[str, Rows]:
    """dump and stats over every damaged partition (written under `base`); returns the undamaged rows by source."""
    from tank_log.maintenance.verify import check_partition
    from tank_log.storage.datadir import partitions_at

    wants = {s: original_rows(s) for s in {d.source for d in cases}}
    for d in cases:
        path = apply(d, base)
        want = wants[d.source]
        (part,) = partitions_at(path)
        if d.kind != "none" and not any(p.severity == "error" for p in check_partition(part)):  # verify, no /proc
            sweep.invisible.add(d.topic)
        rc, message, got = read_dump(path)
        wrong = wrong_seqs(got, want)
        sweep.first[d.topic] = wrong[0] if wrong else None
        sweep.runs.append(Run("dump", d, rc, message, wrong))
        rc, message, differs = read_stats(path, want)
        first = sweep.first[d.topic]
        sweep.runs.append(Run("stats", d, rc, message, [want[0][0]] if differs else [], first))
    return wants


def sweep_export(
    cases: list[Damage], base: str, wants: dict[str, Rows], sweep: Sweep, *, where: str, mode: str, work: str
) -> None:
    """One export run over every damaged partition; each partition's outcome against its undamaged rows."""
    from deltalake import DeltaTable

    from tank_log.lakehouse import recorded_version

    table = os.path.join(work, f"table-{where}-{mode}")
    report = os.path.join(work, f"report-{where}-{mode}.json")
    flags = ["--in-driver-max-bytes=0"] if where == "executors" else ["--in-driver-max-bytes=1gb"]
    cmd = [sys.executable, os.path.join(ROOT, "jobs", "export_delta.py"), "--master", "local[2]", *flags]
    cmd += ["--data-dir", base, "--table", table, "--report", report, "--on-corruption", mode]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=ROOT)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode not in (0, 1) or "Traceback" in proc.stderr:
        raise RuntimeError(f"export ({where}, {mode}) exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    parts = {p["topic"]: p for p in json.load(open(report))["partitions"]}
    dt = DeltaTable(table)
    t = dt.to_pyarrow_table(columns=["topic", "seq", "value"]).to_pydict()
    rows_by_topic: dict[str, Rows] = {}
    for topic, seq, value in zip(t["topic"], t["seq"], t["value"], strict=True):
        rows_by_topic.setdefault(topic, []).append((seq, base64.b64encode(value)))
    for d in cases:
        p = parts[d.topic]
        want = wants[d.source]
        got = sorted(rows_by_topic.get(d.topic, []))
        recorded = recorded_version(dt, table, d.topic, 0)[1]
        failed = p["status"] == "failed"
        message = p.get("error") or "" if failed else ""
        wrong = wrong_seqs(got, want)
        run = Run(f"export-{where}-{mode}", d, 1 if failed else 0, message, wrong, sweep.first.get(d.topic))
        run.recorded = recorded
        held = [r for r in want if recorded is not None and r[0] <= recorded]
        run.past_hole = recorded is not None and (got != held)
        sweep.runs.append(run)


def sweep_source(cases: list[Damage], base: str, wants: dict[str, Rows], sweep: Sweep, spark: Any) -> None:
    """The `tank` data source, one read per damaged partition (also split at every index entry: `split_bytes` 1)."""
    from tank_spark.source import register

    register(spark)
    for d in cases:
        for split in ("whole", "split"):
            reader = spark.read.format("tank").option("topics", d.topic)
            if split == "split":
                reader = reader.option("split_bytes", "1")
            try:
                t = reader.load(base).select("seq", "value").toArrow().to_pydict()
                rc, message = 0, ""
                got = [(seq, base64.b64encode(value)) for seq, value in zip(t["seq"], t["value"], strict=True)]
            except Exception as err:  # a failed Spark job: its message says why
                rc, message, got = 1, str(err), []
            wrong = wrong_seqs(sorted(got), wants[d.source]) if rc == 0 else [wants[d.source][0][0]]
            if rc != 0 and d.kind == "none":
                wrong = []  # a failed read of undamaged data: a false alarm
            sweep.runs.append(Run(f"source-{split}", d, rc, message, wrong, sweep.first.get(d.topic)))


def new_spark() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    from tank_spark import worker_daemon

    conf = SparkConf().setMaster("local[2]").setAppName("hole-sweep")
    conf.set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
    worker_daemon.configure(conf)  # as the jobs run
    session = SparkSession.builder.config(conf=conf).getOrCreate()
    session.sparkContext.setLogLevel("OFF")
    return session


def run_sweep(
    cases: list[Damage],
    work: str,
    *,
    exports: list[tuple[str, str]],
    spark: Callable[[], Any] | None,
    log: Callable[[str], None] = lambda s: None,
) -> Sweep:
    sweep = Sweep()
    base = os.path.join(work, "base")
    os.makedirs(base)
    wants = sweep_library(cases, base, sweep)
    log(f"dump, stats: {len(cases)} damaged partitions read")
    for where, mode in exports:
        sweep_export(cases, base, wants, sweep, where=where, mode=mode, work=work)
        log(f"export ({where}, --on-corruption {mode}) done")
    if spark is not None:
        sweep_source(cases, base, wants, sweep, spark())
        log("tank data source done")
    return sweep


def iter_report(sweep: Sweep) -> Iterator[str]:
    figures = sweep.figures()
    yield f"damaged partitions: {figures['damages']} (invisible to verify too: {figures['invisible_to_verify']})"
    for reader, f in figures.items():
        if isinstance(f, dict):
            yield (
                f"{reader:24} runs {f['runs']:5}  losses {f['losses']:5}  silent {f['silent']:3}  "
                f"(+{f['silent_invisible']} invisible)  records past a hole {f['records_past_hole']} "
                f"(+{f['records_past_hole_invisible']} invisible)  false alarms {f['false_alarms']}  "
                f"exit 0 with a loss {f['exit_0_losses']}"
            )
    for line in sweep.failures():
        yield "FAIL " + line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-per-segment", type=int, help="bundle positions per kind and segment (default: all)")
    ap.add_argument("--max-segments", type=int, help="RO segments per partition (default: all)")
    ap.add_argument("--no-spark", action="store_true", help="dump, stats and the export in the driver only")
    ap.add_argument("--no-source", action="store_true", help="not the tank data source (one Spark job per read)")
    ap.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the readers warn about every hole: the figures say it
    cases = damages(args.max_per_segment, args.max_segments)
    exports = [("driver", "prefix"), ("driver", "skip")]
    if not args.no_spark:
        exports += [("executors", "prefix"), ("executors", "skip")]
    with tempfile.TemporaryDirectory(prefix="hole-sweep-") as work:
        sweep = run_sweep(
            cases,
            work,
            exports=exports,
            spark=None if args.no_spark or args.no_source else new_spark,
            log=lambda s: print(s, flush=True),
        )
        for line in iter_report(sweep):  # before the work directory is removed (slow on some disks)
            print(line, flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(sweep.figures(), fh, indent=2)
    return 1 if sweep.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
