"""Retention with the export stopped: producers append every night, retention runs every night with
`keep_unexported`, the export is off for the first nights and back on after. Prints, per night: messages produced,
exported (rows in the table), deleted by retention, kept back for the table, and lost (produced, in neither the
TANK data nor the table: must be 0 while the bound is not reached). Before the first night the data is exported
once (the table exists), then the export is down.

    python bench/holdback.py [--nights-off 3] [--nights 5] [--partitions 4] [--per-night 20000] [--no-guard]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def append_night(base: str, partitions: int, per_night: int, night: int, segments: int = 4) -> None:
    """Seal each partition's active segment and append `per_night` messages in `segments` segments (a roll each)."""
    from tank_log.format.bundle import Message
    from tank_log.storage.datadir import partitions_at
    from tank_log.storage.writer import write_segment

    for pid in range(partitions):
        pdir = os.path.join(base, "orders", str(pid))
        os.makedirs(pdir, exist_ok=True)
        first = 1
        parts = partitions_at(pdir) if os.listdir(pdir) else []
        if parts and parts[0].active is not None:
            a = parts[0].active
            last = max(m.seq for m in a.messages())
            os.rename(a.path, os.path.join(pdir, f"{a.base}-{last}_{a.name.ts}.ilog"))
            first = last + 1
        n = per_night // segments
        for s in range(segments):
            msgs = [
                Message(first + i, 1_800_000_000_000 + night * 86_400_000 + first + i, b"k%d" % i, b"v" * 80)
                for i in range(n)
            ]
            write_segment(pdir, msgs, active=s == segments - 1, ts=1_800_000_000 + night * 86_400 + s)
            first += n


def tank_seqs(base: str) -> set[tuple[int, int]]:
    from tank_log.storage.datadir import partitions_at

    out = set()
    for part in partitions_at(base):
        for seg in part.segments:
            for chunk in seg.chunks():
                out.update((part.id, int(s)) for s in chunk.cols.seq.tolist())
    return out


def table_seqs(table: str) -> set[tuple[int, int]]:
    if not os.path.exists(table):
        return set()
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    t = ds.dataset(DeltaTable(table).file_uris(), format="parquet").to_table(columns=["partition", "seq"])
    return set(zip(t["partition"].to_pylist(), t["seq"].to_pylist(), strict=True))


def run(job: str, *args: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as rep:
        cmd = [sys.executable, os.path.join(ROOT, "jobs", f"{job}.py"), "--master", "local[2]", *args]
        r = subprocess.run([*cmd, "--report", rep.name], capture_output=True, text=True)
        doc = json.load(open(rep.name))
        doc["exit"] = r.returncode
        return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nights", type=int, default=5)
    ap.add_argument("--nights-off", type=int, default=3, help="the first nights without the export")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--per-night", type=int, default=20_000)
    ap.add_argument("--no-guard", action="store_true", help="retention without keep_unexported (the reference)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base, table = os.path.join(tmp, "base"), os.path.join(tmp, "lake")
        os.makedirs(os.path.join(base, "orders"))
        with open(os.path.join(base, "orders", "config"), "w") as fh:
            fh.write("retention.segments.count=2\n")  # the broker's limit: every night wants most segments gone
        append_night(base, args.partitions, args.per_night, 0)  # before the nights: exported, then the export stops
        produced = tank_seqs(base)
        assert run("export_delta", "--data-dir", base, "--table", table)["exit"] == 0
        deleted_total = 0
        for night in range(1, args.nights + 1):
            before = tank_seqs(base)
            append_night(base, args.partitions, args.per_night, night)
            produced |= tank_seqs(base) - before
            exporting = night > args.nights_off
            if exporting:
                exp = run("export_delta", "--data-dir", base, "--table", table)
                assert exp["exit"] == 0, exp
            guard = [] if args.no_guard else ["--keep-unexported", table]
            ret = run("retention", "--data-dir", base, "--broker-stopped", *guard)
            deleted = sum(p.get("messages_deleted") or 0 for p in ret["partitions"])
            deleted_total += deleted
            kept = sum((p.get("kept_unexported") or {}).get("bytes", 0) for p in ret["partitions"])
            kept_segments = sum((p.get("kept_unexported") or {}).get("segments", 0) for p in ret["partitions"])
            in_tank, in_table = tank_seqs(base), table_seqs(table)
            lost = len(produced - in_tank - in_table)
            print(
                json.dumps(
                    {
                        "night": night,
                        "export": "on" if exporting else "off",
                        "produced": len(produced),
                        "exported": len(in_table),
                        "deleted_this_night": deleted,
                        "deleted_total": deleted_total,
                        "kept_back_segments": kept_segments,
                        "kept_back_bytes": kept,
                        "in_tank": len(in_tank),
                        "lost": lost,
                        "retention_exit": ret["exit"],
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
