"""A seeded, bounded damage sweep through the maintenance writers, as an adversarial operator would run it.

Each case copies a fixture written by the real broker (tests/data/fixtures), turns every topic into a compacted one,
damages one partition and runs one writer through the real CLI (`tank-log compact/maintain/repair`, broker
stopped). The damages: a segment cut at a bundle boundary or inside a bundle, a bundle duplicated or cut out, a
copy of an RO segment under an overlapping name, the broker's resurrected compaction inputs next to their output
(§6.4, §11.15), an index left after its segment was lost, a segment lost with its index. The writers: compaction,
maintain (repair, retention by the topic's config, compaction, indexes, verify), maintain --salvage, repair.

A run passes when it exits non-zero or names the damaged file in what it prints (its report, its log), and when
a compaction that ran lost and renumbered no survivor against the compaction of the intact copy. Prints the
figures (and, with --json, one JSON object).

    python bench/damage_sweep.py --seed 1 --cases 40            # every writer on each case
    python bench/damage_sweep.py --seed 1 --cases 10 --one-writer  # the suite's short mode
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "data", "fixtures")
TANK_LOG = os.path.join(os.path.dirname(sys.executable), "tank-log")
SOURCES = {
    "E": "E_compaction_exact/before/data",
    "B": "B_compaction_restart/before/data",
    "A": "A_multi/data",
}
DAMAGES = (
    "cut-at-boundary",
    "cut-inside-bundle",
    "duplicate-bundle",
    "missing-bundle",
    "overlap-copy",
    "resurrected-inputs",
    "orphan-index",
    "lost-file",
)
WRITERS = {
    "compact": ["compact", "--force", "--broker-stopped"],
    "maintain": ["maintain", "--force", "--broker-stopped"],
    "maintain-salvage": ["maintain", "--force", "--salvage", "--broker-stopped"],
    "maintain-retention": ["maintain", "--force", "--broker-stopped"],  # with retention.segments.count in config
    "repair": ["repair"],
}
COMPACTING = {"compact", "maintain", "maintain-salvage", "maintain-retention"}


@dataclass
class Case:
    source: str
    damage: str
    partition: str = ""  # topic/N
    files: list[str] = field(default_factory=list)  # the damaged (or lost) files' names
    undetectable: bool = False  # nothing on disk tells (a lost segment with its index: a gap like compaction's)


@dataclass
class Run:
    case: Case
    writer: str
    exit: int
    named: bool
    laundered: bool
    survivors_lost: int = 0
    renumbered: int = 0
    note: str = ""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TANK_LOG, *args], capture_output=True, text=True, timeout=300)


def _prepare(source: str, dst: str, *, retention: bool = False) -> str:
    shutil.copytree(os.path.join(FIXTURES, SOURCES[source]), dst)
    for topic in sorted(os.listdir(dst)):
        cfg = os.path.join(dst, topic, "config")
        if not os.path.isdir(os.path.join(dst, topic)):
            continue
        text = open(cfg).read() if os.path.exists(cfg) else ""
        lines = [ln for ln in text.splitlines() if ln and not ln.startswith(("log.cleanup.policy", "retention."))]
        lines.append("log.cleanup.policy=cleanup")
        if retention:
            lines.append("retention.segments.count=2")
        with open(cfg, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return dst


def _ro(part_dir: str) -> list[str]:
    from tank_log.format.names import FileName, Kind, parse_name

    out = []
    for n in os.listdir(part_dir):
        p = parse_name(n)
        if isinstance(p, FileName) and p.kind is Kind.RO:
            out.append((p.base, n))
    return [n for _, n in sorted(out)]


def _bundles(path: str) -> list[tuple[int, int]]:
    from tank_log.storage.segment import Segment

    return [(h.offset, h.offset + h.size) for h in Segment(path).bundles()]


def _sparse(path: str) -> list[bool]:
    from tank_log.storage.segment import Segment

    return [h.sparse for h in Segment(path).bundles()]


def _partitions(base: str) -> list[str]:
    return sorted(p for p in glob.glob(os.path.join(base, "*", "*")) if os.path.isdir(p) and len(_ro(p)) >= 3)


def damage(base: str, case: Case, rng: random.Random, scratch: str) -> None:
    """Apply `case.damage` to a random partition of `base` (with at least 3 RO segments)."""
    part = rng.choice(_partitions(base))
    case.partition = os.path.relpath(part, base)
    ro = _ro(part)
    # not the last RO segment for the in-file damages: its cut is one salvage refuses anyway; any other is fair
    name = rng.choice(ro[:-1])
    path = os.path.join(part, name)
    data = open(path, "rb").read()
    bundles = _bundles(path)
    case.files = [name]
    kind = case.damage
    if kind in ("cut-at-boundary", "cut-inside-bundle", "duplicate-bundle", "missing-bundle") and len(bundles) < 2:
        kind = case.damage = "orphan-index"
    if kind == "cut-at-boundary":
        at = bundles[rng.randrange(1, len(bundles))][0]
        data = data[:at]
    elif kind == "cut-inside-bundle":
        start, end = bundles[rng.randrange(len(bundles))]
        data = data[: rng.randrange(start + 1, end)]
    elif kind == "duplicate-bundle":
        start, end = bundles[rng.randrange(len(bundles))]
        data = data[:end] + data[start:end] + data[end:]
    elif kind == "missing-bundle":
        i = rng.randrange(len(bundles))
        start, end = bundles[i]
        data = data[:start] + data[end:]
        sparse = _sparse(path)
        # a bundle cut out before a sparse one, which carries its own seqs (§3.6): nothing after it is renumbered,
        # and the missing seqs are a gap like the producer's own, which nothing on disk tells apart (unless an index
        # entry moved with the bytes)
        case.undetectable = i + 1 < len(sparse) and sparse[i + 1]
    if kind in ("cut-at-boundary", "cut-inside-bundle", "duplicate-bundle", "missing-bundle"):
        with open(path, "wb") as fh:
            fh.write(data)
        return
    if kind == "overlap-copy":  # the same bytes again under a later timestamp: seqs twice
        from tank_log.format.names import format_ro_name, parse_name

        p = parse_name(name)
        copy = format_ro_name(p.base, p.last, (p.ts or 0) + 1)
        shutil.copyfile(path, os.path.join(part, copy))
        case.files = [copy, name]
        return
    if kind == "resurrected-inputs":  # the broker's open after a compaction killed in phase B-D (§6.4)
        inputs = {n: open(os.path.join(part, n), "rb").read() for n in ro}
        r = _cli("compact", "--force", "--broker-stopped", "--topics", case.partition.split("/")[0], base)
        if r.returncode != 0:
            raise RuntimeError(f"compaction of the intact copy failed: {r.stdout[-500:]}{r.stderr[-500:]}")
        now = set(os.listdir(part))
        back = [n for n in inputs if n not in now]
        for n in back:
            with open(os.path.join(part, n), "wb") as fh:
                fh.write(inputs[n])
        case.files = back
        return
    if kind == "orphan-index":
        os.unlink(path)
        # the first segment's: what retention's deletion killed between the log and its index leaves (§5)
        case.undetectable = name == ro[0]
        return
    if kind == "lost-file":
        from tank_log.format.names import parse_name

        os.unlink(path)
        index = os.path.join(part, f"{parse_name(name).base}.index")
        if os.path.exists(index):
            os.unlink(index)
        case.undetectable = True  # a gap between RO segments is what compaction leaves too (§4.4 step 2)
        return
    raise ValueError(kind)


def messages(part_dir: str) -> dict[int, tuple[int, bytes | None, bytes]]:
    """seq → (ts, key, value) of every RO segment as its bytes say (no completeness check: what a consumer gets)."""
    from tank_log.errors import TankFormatError
    from tank_log.storage.segment import Segment

    out: dict[int, tuple[int, bytes | None, bytes]] = {}
    for name in _ro(part_dir):
        try:
            for m in Segment(os.path.join(part_dir, name)).messages():
                out[m.seq] = (m.ts, m.key, m.value)
        except TankFormatError:
            continue
    return out


def run_case(source: str, kind: str, writer: str, seed: int, work: str, intact: dict[str, str]) -> Run:
    rng = random.Random(seed)
    case = Case(source, kind)
    base = _prepare(source, os.path.join(work, f"{source}-{kind}-{writer}-{seed}"), retention=writer.endswith("tion"))
    damage(base, case, rng, work)
    part_dir = os.path.join(base, case.partition)
    topic = case.partition.split("/")[0]
    before = messages(part_dir)
    args = [*WRITERS[writer], part_dir] if writer == "repair" else [*WRITERS[writer], "--topics", topic, base]
    r = _cli(*args)
    out = r.stdout + r.stderr
    named = any(f in out for f in case.files) or (
        case.damage == "orphan-index" and f"{case.files[0].split('-')[0]}.index" in out
    )
    verified = r.returncode != 0 or named or _cli("verify", part_dir).returncode != 0  # damage still visible
    laundered = r.returncode == 0 and not named and not verified and not case.undetectable
    run = Run(case, writer, r.returncode, named, laundered)
    if writer == "repair" and case.damage not in NAMES_DAMAGE and not r.returncode and not named:
        run.note = "repair reads names only: verify names it"
    entry = next((e for e in reports(r.stdout) if f"{e.get('topic')}/{e.get('partition')}" == case.partition), {})
    compacted = (entry.get("steps") or {}).get("compaction", entry).get("status") == "compacted"
    if writer in COMPACTING and compacted:  # it rewrote the damaged partition: survivors against the intact's
        if source not in intact:
            ref = _prepare(source, os.path.join(work, f"{source}-intact"))
            c = _cli("compact", "--force", "--broker-stopped", ref)
            if c.returncode != 0:
                raise RuntimeError(f"compaction of the intact copy failed: {c.stdout[-500:]}")
            intact[source] = ref
        want = messages(os.path.join(intact[source], case.partition))
        got = messages(part_dir)
        # lost by compaction: a survivor of the intact compaction the damaged input still held as written
        floor = min(got, default=0) if writer == "maintain-retention" else 0  # below it: retention's deletions
        run.survivors_lost = sum(1 for s, m in want.items() if s >= floor and before.get(s) == m and got.get(s) != m)
        run.renumbered = sum(1 for s, m in got.items() if s in want and want[s] != m and before.get(s) != m)
    return run


NAMES_DAMAGE = {"overlap-copy", "resurrected-inputs", "orphan-index"}  # what the names show (repair's part)


def reports(out: str) -> list[dict]:
    found = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def sweep(seed: int, cases: int, *, one_writer: bool = False, work: str | None = None) -> dict:
    rng = random.Random(seed)
    own = work is None
    work = work or tempfile.mkdtemp(prefix="damage-sweep-")
    intact: dict[str, str] = {}
    runs: list[Run] = []
    t0 = time.monotonic()
    try:
        for i in range(cases):
            source = rng.choice(sorted(SOURCES))
            kind = DAMAGES[i % len(DAMAGES)] if cases >= len(DAMAGES) else rng.choice(DAMAGES)
            writers = [rng.choice(sorted(WRITERS))] if one_writer else sorted(WRITERS)
            for w in writers:
                runs.append(run_case(source, kind, w, rng.randrange(1 << 30), work, intact))
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    outcomes = Counter(
        "refused (exit != 0)"
        if r.exit
        else "exit 0, named"
        if r.named
        else "exit 0, undetectable (no evidence on disk)"
        if r.case.undetectable
        else "exit 0, repair of in-file damage (verify names it)"
        if r.note
        else "exit 0, resolved (verify clean, nothing lost)"
        if not r.laundered
        else "exit 0 over damage, not named"
        for r in runs
    )
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "seed": seed,
        "cases": cases,
        "runs": len(runs),
        "seconds": round(time.monotonic() - t0, 1),
        "outcomes": dict(outcomes),
        "laundered": sum(r.laundered for r in runs),
        "undetectable_runs": sum(r.case.undetectable for r in runs),
        "undetectable_exit0_unnamed": sum(r.case.undetectable and not r.exit and not r.named for r in runs),
        "survivors_lost": sum(r.survivors_lost for r in runs),
        "renumbered": sum(r.renumbered for r in runs),
        "by_damage": {
            k: dict(
                Counter(("exit!=0" if r.exit else "named" if r.named else "silent") for r in runs if r.case.damage == k)
            )
            for k in DAMAGES
        },
        "by_writer": {
            w: dict(Counter(("exit!=0" if r.exit else "named" if r.named else "silent") for r in runs if r.writer == w))
            for w in WRITERS
        },
        "bad": [
            {"source": r.case.source, "damage": r.case.damage, "partition": r.case.partition, "writer": r.writer}
            for r in runs
            if r.laundered or r.survivors_lost or r.renumbered
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=16, help="damaged copies (each run through every writer)")
    ap.add_argument("--one-writer", action="store_true", help="one random writer per case (the short mode)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = ap.parse_args()
    figures = sweep(args.seed, args.cases, one_writer=args.one_writer)
    if args.json:
        print(json.dumps(figures))
    else:
        for k, v in figures.items():
            print(f"{k}: {v}")
    return 1 if figures["laundered"] or figures["survivors_lost"] or figures["renumbered"] else 0


if __name__ == "__main__":
    sys.exit(main())
