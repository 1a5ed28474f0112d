"""Record the Prometheus metric files the jobs write on the fleet's nights (bench/fleet.py), as test data for the
alert rules (conf/prometheus/tank-log-alerts.yml, tests/alerts/).

The fleet runs as it does in the soak (stand-in brokers that keep appending, nightly exports into one Delta table on a
loopback S3 server, each host's maintenance window), with every job's `--metrics-file` in a node_exporter textfile
directory per host and `tank-log stats --export-table` run after the exports and at the end of every night. Whenever
a run ends, each metric file that changed is copied, with the wall-clock time, into the scenario's directory; its
`manifest.json` holds the nights' boundaries, every run (what, host, start, end, exit code), the faults, and each
maintain run's per-partition outcome. The fleet's own six invariants are checked every night as in the soak.

Scenarios:
  healthy   2 hosts, 3 nights, no fault: every alert must stay silent.
  faults    3 hosts, 5 nights: h1's export off on nights 1 to 3 (the export lag; the bytes retention keeps back come
            near its bound, then pass it: data-loss), h2's broker refuses to stop on nights 1 and 2 (no maintenance:
            the job's last success gets old, the dirty ratio stays high), on night 3 h0's retention cannot read the
            table it guards (the table moved: needs-attention); h0 healthy on every other night.

Run: python bench/record_alert_series.py [--scenario healthy|faults|all] [--out tests/data/alerts]
(about 4 and 8 minutes on 2 cores). The tests read what it wrote; rerun it when a metric changes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fleet  # noqa: E402

OUT = os.path.join(fleet.ROOT, "tests", "data", "alerts")
COMMON = ["--fault-rate", "0", "--continuous-hosts", "0", "--night-s", "2", "--seed", "7"]
SCENARIOS: dict[str, dict[str, Any]] = {
    "healthy": {"argv": ["--hosts", "2", "--nights", "3", *COMMON], "max_holdback_size": "2mb"},
    "faults": {
        "argv": [
            *("--hosts", "3", "--nights", "5", *COMMON),
            *("--force-fault", "1:h1:export-off-3"),
            *("--force-fault", "1:h2:stubborn", "--force-fault", "2:h2:stubborn"),
            *("--force-fault", "3:h0:table-missing"),
        ],
        # about 2.5 nights of what retention holds back of h1's partitions (2 segments of about 4 KiB a night): the
        # export off for 3 nights comes past half of it (near), then past it (data-loss)
        "max_holdback_size": "20kb",
    },
}
OWN = "TANK_ALERT_RECORDING"  # in the environment of every process this recording starts: its pid
METRICS_OF = {"export": "export_delta", "maintain": "maintain", "cli-maintain": "tank-log-maintain", "stats": "stats"}


class RecordingFleet(fleet.Fleet):
    def __init__(self, args: argparse.Namespace, out: str, max_holdback_size: str):
        super().__init__(args)
        self.out = out
        self.max_holdback_size = max_holdback_size
        self.textfile = os.path.join(self.work, "textfile")
        self.bounds: list[float] = []
        self.events: list[dict[str, Any]] = []
        self.runs: list[dict[str, Any]] = []
        self.started: dict[int, float] = {}
        self.last: dict[str, bytes] = {}
        self.night_faults: list[dict[str, list[str]]] = []
        self.moved_table: set[str] = set()  # hosts whose maintain config names a table that is not there (tonight)
        os.makedirs(os.path.join(out, "files"))

    # ---- what the soak runs, with metrics -------------------------------------------------------------------------

    def job_config(self, data_dirs: list[str] | None = None) -> dict[str, Any]:
        config = super().job_config(data_dirs)
        config["retention"]["keep_unexported"]["max_holdback_size"] = self.max_holdback_size
        return config

    def metrics_file(self, what: str, host: str) -> str:
        return os.path.join(self.textfile, host, f"{METRICS_OF[what]}.prom")

    def spawn(self, what: str, h: fleet.Host, cmd: list[str]) -> tuple[Any, fleet.Ran]:
        if what in METRICS_OF:
            cmd = [*cmd, "--metrics-file", self.metrics_file(what, h.name)]
        if what in ("maintain", "cli-maintain") and h.name in self.moved_table:
            cmd = [c if c != self.config_of(h) else self.moved_config(h) for c in cmd]
        proc, ran = super().spawn(what, h, cmd)
        self.started[id(ran)] = time.time()
        return proc, ran

    def full_disk(self, h: fleet.Host, job: list[str]) -> None:
        job = [*job, "--metrics-file", self.metrics_file("maintain", h.name)]
        if h.name in self.moved_table:
            job = [c if c != self.config_of(h) else self.moved_config(h) for c in job]
        super().full_disk(h, job)

    def moved_config(self, h: fleet.Host) -> str:
        """The host's config with retention guarding a table that is not there (the table moved): what the table
        holds is unknown, so retention deletes nothing and the partition needs attention."""
        config = self.job_config([h.base])
        config["retention"]["keep_unexported"]["table"] = f"s3://{fleet.BUCKET}/moved"
        config["retention"]["keep_unexported"]["storage_options"] = self.storage_options
        path = os.path.join(self.work, f"{h.name}-moved.yaml")
        with open(path, "w") as fh:
            json.dump(config, fh)
        return path

    def wait(self, proc: Any, ran: fleet.Ran, *args: Any, **kwargs: Any) -> int:
        code = super().wait(proc, ran, *args, **kwargs)
        end = time.time()
        start = self.started.pop(id(ran), end)
        run = {"what": ran.what, "host": ran.host, "start": start, "end": end, "code": code, "killed": ran.killed}
        run["night"] = len(self.nights)
        if ran.what.startswith("maintain") or ran.what == "cli-maintain":
            run["partitions"] = self.maintain_outcome(ran)
        self.runs.append(run)
        self.snapshot(end)
        return code

    def maintain_outcome(self, ran: fleet.Ran) -> list[dict[str, Any]]:
        """Per partition: the run's status, its retention and compaction steps (from the job's report or the CLI's
        lines)."""
        i = self.ran.index(ran)
        report = ran.cmd[ran.cmd.index("--report") + 1] if "--report" in ran.cmd else None
        entries: list[dict[str, Any]] = []
        try:
            if report is not None and ran.what == "maintain":
                with open(report) as fh:
                    entries = json.load(fh).get("partitions", [])
            elif ran.what == "cli-maintain":
                with open(self.log_of(i)) as fh:
                    entries = [json.loads(line) for line in fh if line.startswith('{"topic"')]
        except (OSError, ValueError):
            return []
        out = []
        for e in entries:
            retention = (e.get("steps") or {}).get("retention") or {}
            kept = retention.get("kept_unexported") or {}
            out.append(
                {
                    "topic": e["topic"],
                    "partition": e["partition"],
                    "status": e["status"],
                    "retention": retention.get("status"),
                    "compaction": ((e.get("steps") or {}).get("compaction") or {}).get("status"),
                    "kept_bytes": kept.get("bytes", 0),
                    "max_bytes": kept.get("max_bytes", 0),
                    "deleted_unexported": retention.get("deleted_unexported") or [],
                }
            )
        return out

    def snapshot(self, t: float) -> None:
        """Every metric file that changed since it was last copied: copied, with the time."""
        for host in sorted(os.listdir(self.textfile)) if os.path.isdir(self.textfile) else []:
            for name in sorted(os.listdir(os.path.join(self.textfile, host))):
                if not name.endswith(".prom"):
                    continue  # prometheus_client's temporary
                with open(os.path.join(self.textfile, host, name), "rb") as fh:
                    data = fh.read()
                key = f"{host}/{name}"
                if self.last.get(key) == data:
                    continue
                self.last[key] = data
                file = f"{len(self.events):04d}-{host}-{name}"
                with open(os.path.join(self.out, "files", file), "wb") as fh:
                    fh.write(data)
                self.events.append({"t": t, "host": host, "name": name[: -len(".prom")], "file": file})

    def stats(self) -> None:
        for h in self.hosts:
            cmd = [os.path.join(fleet.BIN, "tank-log"), "stats", h.base, "--export-table", self.table]
            cmd += [f"--storage-option={k}={v}" for k, v in self.storage_options.items()]
            self.run("stats", h, cmd)

    def env(self, tag: str) -> dict[str, str]:
        return {**super().env(tag), OWN: str(os.getpid())}

    def check_processes(self) -> None:
        """The soak's check, of this recording's processes only: another soak on the machine marks its own too."""
        own = f"{OWN}={os.getpid()}".encode()
        marked = fleet._marked_processes

        def mine() -> list[tuple[int, dict[str, str]]]:
            out = []
            for pid, env in marked():
                try:
                    with open(f"/proc/{pid}/environ", "rb") as fh:
                        if own in fh.read().split(b"\0"):
                            out.append((pid, env))
                except OSError:
                    continue
            return out

        fleet._marked_processes = mine
        try:
            super().check_processes()
        finally:
            fleet._marked_processes = marked

    # ---- the night ------------------------------------------------------------------------------------------------

    def setup(self) -> None:
        self.bounds.append(time.time())
        super().setup()

    def night(self, n: int) -> dict[str, Any]:
        self.bounds.append(time.time())
        return super().night(n)

    def plan_faults(self, night: int) -> dict[str, list[str]]:
        plan = super().plan_faults(night)
        self.night_faults.append(plan)
        return plan

    def exports(self, n: int, faults: dict[str, list[str]]) -> None:
        for h in self.hosts:
            if "export-off-3" in faults[h.name]:
                h.export_off_until = n + 2
        super().exports(n, faults)
        self.stats()

    def window(self, n: int, h: fleet.Host, kinds: list[str]) -> None:
        if "table-missing" in kinds:
            self.moved_table.add(h.name)
        try:
            super().window(n, h, kinds)
        finally:
            self.moved_table.discard(h.name)

    def check(self, n: int, upkeep: bool) -> dict[str, Any]:
        self.stats()
        return super().check(n, upkeep)

    def manifest(self, scenario: str, argv: list[str], summary: dict[str, Any]) -> dict[str, Any]:
        return {
            "scenario": scenario,
            "argv": argv,
            "max_holdback_size": self.max_holdback_size,
            "hosts": [h.name for h in self.hosts],
            "topics": {h.name: h.topics for h in self.hosts},
            "bounds": self.bounds,  # setup start, each night's start, the last night's end (wall-clock seconds)
            "faults": self.night_faults,
            "export_off": {h.name: h.export_off_until for h in self.hosts},
            "events": self.events,
            "runs": self.runs,
            "violations": summary["violations"],
        }


def record(scenario: str, out_root: str) -> dict[str, Any]:
    spec = SCENARIOS[scenario]
    out = os.path.join(out_root, scenario)
    staging = f"{out}.recording"
    shutil.rmtree(staging, ignore_errors=True)
    args = fleet.parse_args(spec["argv"])
    args.workdir = tempfile.mkdtemp(prefix=f"tank-alerts-{scenario}-")
    for d in ("logs", "reports", "checkpoints"):
        os.makedirs(os.path.join(args.workdir, d), exist_ok=True)
    rec = RecordingFleet(args, staging, spec["max_holdback_size"])
    t0 = time.monotonic()
    try:
        rec.setup()
        for n in range(args.nights):
            rec.night(n)
    finally:
        rec.teardown()
    rec.bounds.append(time.time())
    summary = rec.summary(time.monotonic() - t0)
    with open(os.path.join(staging, "manifest.json"), "w") as fh:
        json.dump(rec.manifest(scenario, spec["argv"], summary), fh, indent=1)
    if any(summary["violations"].values()):
        raise SystemExit(
            f"{scenario}: the fleet's invariants were violated, nothing recorded: {summary['violations']} "
            f"(its logs and reports: {args.workdir})"
        )
    shutil.rmtree(out, ignore_errors=True)
    os.rename(staging, out)
    shutil.rmtree(args.workdir, ignore_errors=True)
    print(json.dumps({"scenario": scenario, "events": len(rec.events), "wall_s": summary["wall_s"]}), flush=True)
    return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    for scenario in SCENARIOS if args.scenario == "all" else [args.scenario]:
        record(scenario, args.out)


if __name__ == "__main__":
    main()
