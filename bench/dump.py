"""`tank-log dump` beside the broker's own client on the BENCH.md partition, in the same run.

Generates the BENCH.md partition (2,052,000 messages in 100-message Snappy bundles; ../shared/BENCH.md) unless
--data names one, then alternates, `--runs` times:

- `tank-log dump PARTITION > /dev/null` (the whole command: start-up, reading, JSON lines);
- the reference, with --tank-cli and --tank (binaries of a TANK build): the broker serving the same base path on
  loopback and `tank-cli -b 127.0.0.1:PORT -t bench -p 0 get -d 0 > /dev/null` (its default display: each
  message's content on a line). BENCH.md's figure for it is 2.70 M msgs/s on its machine.

Reports msgs/s per run, the ratio to the reference in each round (this machine is shared: only same-round ratios
mean anything), the output bytes of each, and the load average before and after.

Run: python bench/dump.py [--data BASE] [--tank-cli PATH --tank PATH] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import machine  # noqa: E402

MESSAGES = 2_052_000
TANK_LOG = os.path.join(os.path.dirname(sys.executable), "tank-log")


def loadavg() -> list[str]:
    with open("/proc/loadavg") as fh:
        return fh.read().split()[:3]


def timed(cmd: list[str]) -> float:
    """Wall seconds of `cmd`, its output going to /dev/null (as an operator's `> /dev/null`: no pipe to drain)."""
    with open(os.devnull, "wb") as null:
        t0 = time.perf_counter()
        if subprocess.run(cmd, stdout=null, stderr=subprocess.DEVNULL).returncode:
            raise SystemExit(f"{cmd[0]} failed")
        return time.perf_counter() - t0


def output_bytes(cmd: list[str]) -> int:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    size = 0
    while chunk := proc.stdout.read(1 << 20):
        size += len(chunk)
    proc.wait()
    return size


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_broker(tank: str, base: str, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [tank, "-p", base, "-l", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the broker did not listen")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", help="a base path with the BENCH.md partition as bench/0 (generated if not given)")
    ap.add_argument("--tank-cli", help="the broker's client binary (the reference)")
    ap.add_argument("--tank", help="the broker binary, to serve --data for the client")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    base = args.data
    if base is None:
        from compact import generate

        base = tempfile.mkdtemp(prefix="tank-dump-")
        generate(os.path.join(base, "bench", "0"))
        with open(os.path.join(base, "bench", "config"), "w") as fh:
            fh.write("log.cleanup.policy=cleanup\n")
    part = os.path.join(base, "bench", "0")
    broker = None
    reference = None
    if args.tank_cli and args.tank:
        served = tempfile.mkdtemp(prefix="tank-dump-served-")  # the broker may write to what it serves
        shutil.copytree(os.path.join(base, "bench"), os.path.join(served, "bench"))
        port = free_port()
        broker = start_broker(args.tank, served, port)
        # -d: stop once the partition is drained (its default display: each message's content on a line)
        reference = [args.tank_cli, "-b", f"127.0.0.1:{port}", "-t", "bench", "-p", "0", "get", "-d", "0"]
    dump = [TANK_LOG, "dump", part]
    out: dict = {"machine": machine(), "load_before": loadavg(), "runs": []}
    try:
        out["output_bytes"] = {
            "dump": output_bytes(dump),
            **({"tank_cli": output_bytes(reference)} if reference else {}),
        }
        for _ in range(args.runs):
            run: dict = {}
            wall = timed(dump)
            run["dump"] = {"wall_s": round(wall, 3), "msgs_per_s": round(MESSAGES / wall / 1e6, 2)}
            if reference:
                wall_ref = timed(reference)
                run["tank_cli"] = {"wall_s": round(wall_ref, 3), "msgs_per_s": round(MESSAGES / wall_ref / 1e6, 2)}
                run["dump_over_tank_cli"] = round(wall_ref / wall, 2)
            out["runs"].append(run)
            print(json.dumps(run), file=sys.stderr)
    finally:
        if broker is not None:
            broker.send_signal(signal.SIGINT)
            broker.wait(30)
    out["load_after"] = loadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
