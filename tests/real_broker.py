"""The real TANK broker as the oracle: start `tank` over a data directory on a loopback port, consume partitions
through `tank-cli`, produce a message, stop it; and `tank-log dump` of the same directory to compare with.

The binaries come from the environment: TANK_BIN (the broker, `tank`) and TANK_CLI (its client, `tank-cli`), both
built from phaistos-networks/TANK with its own Makefile. `binaries()` gives them, or the reason to skip.

The broker writes to what it serves (crash recovery at a partition's open, index rebuilds, docs/FORMAT.md §2.6), so
callers hand it a copy when the original must stay as it was. It raises its own core-file limit (`main`), so it
runs in a scratch working directory of its own, where a core dump lands and is removed at `stop`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

TANK_LOG = os.path.join(os.path.dirname(sys.executable), "tank-log")


# what the broker prints before it aborts or exits on bad data (an assertion, §3.11's torn tail, §2.6's index entry
# past the end of the log)
FATAL_MARKS = ("Assertion", "Likely corrupt", "Dataset corruption", "Aborting", "Implementation Missing")


@dataclass(frozen=True)
class Consumed:
    """One message as a client sees it: `key` b"" when it has none."""

    seq: int
    ts: int
    key: bytes
    value: bytes


def binaries() -> tuple[str, str] | str:
    """(tank, tank-cli) from TANK_BIN and TANK_CLI, or why they cannot be used."""
    tank, cli = os.environ.get("TANK_BIN"), os.environ.get("TANK_CLI")
    if not tank or not cli:
        return "TANK_BIN and TANK_CLI name no built broker and client (see docs/development.md)"
    for name, path in (("TANK_BIN", tank), ("TANK_CLI", cli)):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{name}={path} is not an executable file"
    return tank, cli


class BrokerFailed(AssertionError):
    """The broker died, refused to start, or its client failed; the message carries the broker's log tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def partitions(base: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """(topic, partition) of every partition the broker registers at startup over `base` (§1.2–§1.4): topic
    directories not starting with `.`, partitions 0..N-1 for N digit-named entries."""
    out = []
    for topic in sorted(os.listdir(base)):
        path = os.path.join(base, topic)
        if topic.startswith(".") or not os.path.isdir(path):
            continue
        count = sum(1 for name in os.listdir(path) if name.isdigit())
        out += [(topic, p) for p in range(count)]
    return out


class RealBroker:
    """One `tank -p BASE -l 127.0.0.1:PORT` process (its own process group) and its client.

    Use as a context manager, or `start()` / `stop()`. Every client call checks that the broker still runs
    afterwards: an abort (an assertion, §11) raises `BrokerFailed` with the broker's output."""

    def __init__(
        self,
        tank: str,
        tank_cli: str,
        base: str | os.PathLike[str],
        *,
        port: int | None = None,
        log_path: str | None = None,
    ):
        self.tank, self.tank_cli, self.base = tank, tank_cli, os.fspath(base)
        self.port = port or free_port()
        self.given_log = log_path  # where its output goes (appended; kept), else a file in its scratch directory
        self.log_path: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir: str | None = None
        self.returncode: int | None = None
        self._log_text = ""
        self._log_from = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> RealBroker:
        self.workdir = tempfile.mkdtemp(prefix="tank-broker-")
        self.log_path = self.given_log or os.path.join(self.workdir, "broker.log")
        self._log_from = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.tank, "-p", self.base, "-l", self.endpoint],
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise BrokerFailed(f"the broker exited at start with {self.returncode}:\n{self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise BrokerFailed(f"the broker did not listen on {self.endpoint} within {timeout} s:\n{self.log()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        """What the broker printed (stdout and stderr) since this start, also after `stop`."""
        if self.workdir is not None and self.log_path is not None:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_from)
                self._log_text = fh.read().decode("utf-8", "replace")
        return self._log_text

    def stop(self, timeout: float = 15.0) -> int:
        """SIGINT (the broker's clean shutdown) to its process group, SIGKILL after `timeout` (at once when it
        printed a fatal message: it hangs); its exit code (negative: the signal that ended it, -6 = an abort)."""
        if self.proc is not None:
            if self.proc.poll() is None and self.fatal() is not None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGINT)
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
                except ProcessLookupError:
                    self.proc.wait()
            self.returncode = self.proc.returncode
            self.proc = None
        if self.workdir is not None:
            self.log()
            shutil.rmtree(self.workdir, ignore_errors=True)  # with any core dump
            self.workdir = None
        return self.returncode if self.returncode is not None else 0

    def __enter__(self) -> RealBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def fatal(self) -> str | None:
        """Why the broker can serve no more: it exited, or it printed a fatal message and hangs (it may hang inside
        `exit()`, §3.11)."""
        if not self.alive():
            return f"the broker exited with {self.proc.poll() if self.proc else self.returncode}"
        text = self.log()
        for line in text.splitlines():
            if any(mark in line for mark in FATAL_MARKS):
                return f"the broker printed {line.strip()!r}"
        return None

    def _cli(self, args: list[str], timeout: float) -> bytes:
        cmd = [self.tank_cli, "-b", self.endpoint, *args]
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            cli = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
            deadline = time.monotonic() + timeout
            why = None
            while cli.poll() is None:
                why = self.fatal() or (f"no answer in {timeout} s" if time.monotonic() > deadline else None)
                if why is not None:
                    cli.kill()
                    cli.wait()
                    break
                time.sleep(0.05)
            why = why or self.fatal()
            out.seek(0)
            err.seek(0)
            if cli.returncode != 0 or why is not None:
                raise BrokerFailed(
                    f"{' '.join(cmd)} exited {cli.returncode}: {err.read().decode('utf-8', 'replace')[-2000:]}\n"
                    f"{why or 'the broker still runs'}; its output:\n{self.log()[-4000:]}"
                )
            return out.read()

    def consume(self, topic: str, partition: int, *, start: int = 0, timeout: float = 120.0) -> list[Consumed]:
        """Every message of the partition from `start` (0: the first available, §4.4) until drained, through
        `tank-cli get -d`; the broker opens the partition at the first request (§2.6)."""
        out = self._cli(
            ["-t", topic, "-p", str(partition), "get", "-F", "ts_ms,seqnum,size,key,content", "-d", str(start)],
            timeout,
        )
        return parse_get_output(out)

    def produce(self, topic: str, partition: int, key: bytes, value: bytes, *, timeout: float = 30.0) -> None:
        """One keyed message through the broker's produce path (`tank-cli produce -K key=value`)."""
        if b"=" in key or b"\n" in key + value:
            raise ValueError("a key without '=' and no newline: tank-cli splits on them")
        arg = (key + b"=" + value).decode()
        self._cli(["-t", topic, "-p", str(partition), "produce", "-K", arg], timeout)

    def produce_bundle(
        self, topic: str, partition: int, pairs: list[tuple[bytes, bytes]], *, timeout: float = 30.0
    ) -> None:
        """Keyed messages as one bundle through the broker's produce path (`tank-cli produce -s N -K k=v ...`)."""
        args = []
        for key, value in pairs:
            if b"=" in key or b"\n" in key + value:
                raise ValueError("a key without '=' and no newline: tank-cli splits on them")
            args.append((key + b"=" + value).decode())
        self._cli(["-t", topic, "-p", str(partition), "produce", "-s", str(len(args)), "-K", *args], timeout)


_HEAD = re.compile(rb"(\d+):seq=(\d+):size=(\d+):\[")


def parse_get_output(out: bytes) -> list[Consumed]:
    """`tank-cli get -F ts_ms,seqnum,size,key,content` lines: `TS:seq=N:size=S:[KEY]:CONTENT\\n`, raw bytes. The
    key's end is found from the content's size (a key may hold `]:` and newlines): the shortest key (0..255 bytes)
    after which `]:`, S bytes and a newline end at another line's head or at the end.

    Raises:
        ValueError: output that does not parse.
    """
    msgs, pos = [], 0
    while pos < len(out):
        head = _HEAD.match(out, pos)
        if head is None:
            raise ValueError(f"tank-cli output at byte {pos}: {out[pos : pos + 80]!r} is no message line")
        ts, seq, size = (int(g) for g in head.groups())
        key_at = head.end()
        fits, at = [], out.find(b"]:", key_at, key_at + 257)
        while at != -1:
            end = at + 2 + size
            if out[end : end + 1] == b"\n" and (end + 1 == len(out) or _HEAD.match(out, end + 1)):
                fits.append(at - key_at)
            at = out.find(b"]:", at + 1, key_at + 257)
        if not fits:
            raise ValueError(f"tank-cli output at byte {pos} (seq {seq}): no key length fits")
        k = fits[0]  # the shortest: a longer fit would hold the next line's head in its key
        value_at = key_at + k + 2
        msgs.append(Consumed(seq, ts, out[key_at : key_at + k], out[value_at : value_at + size]))
        pos = value_at + size + 1
    return msgs


def dump(path: str | os.PathLike[str]) -> dict[tuple[str, int], list[Consumed]]:
    """`tank-log dump PATH` (the command itself), per (topic, partition), as a client sees the messages."""
    done = subprocess.run([TANK_LOG, "dump", os.fspath(path)], capture_output=True, check=False)
    if done.returncode:
        raise AssertionError(f"tank-log dump {path} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    out: dict[tuple[str, int], list[Consumed]] = {}
    for line in done.stdout.splitlines():
        row = json.loads(line)
        out.setdefault((row["topic"], row["partition"]), []).append(
            Consumed(row["seq"], row["ts"], base64.b64decode(row["key_b64"]), base64.b64decode(row["value_b64"]))
        )
    return out


def served_copy(base: str | os.PathLike[str], into: str | os.PathLike[str]) -> str:
    """A copy of base path `base` at `into` for the broker to serve (it writes to what it serves)."""
    shutil.copytree(base, into, symlinks=True)
    return os.fspath(into)


def consume_all(broker: RealBroker) -> Iterator[tuple[tuple[str, int], list[Consumed]]]:
    """Every partition the broker registers over its base path, consumed from the first available seq."""
    for topic, partition in partitions(broker.base):
        yield (topic, partition), broker.consume(topic, partition)


def consume_from(tank_cli: str, endpoint: str, topic: str, partition: int, timeout: float = 60.0) -> list[Consumed]:
    """Every message of a partition, from the first available seq, as any client of the broker at `endpoint` sees it
    (`tank-cli get -d`; a broker this process does not own, e.g. a fleet host's)."""
    cmd = [tank_cli, "-b", endpoint, "-t", topic, "-p", str(partition), "get", "-F", "ts_ms,seqnum,size,key,content"]
    done = subprocess.run(
        [*cmd, "-d", "0"], capture_output=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False
    )
    if done.returncode:
        raise BrokerFailed(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.decode('utf-8', 'replace')[-500:]}")
    return parse_get_output(done.stdout)


def _fleet_partitions(base: str) -> list[tuple[str, int, bool]]:
    """(topic, partition, cleanup) of every partition under `base` whose topic's config names a policy."""
    out = []
    for topic, partition in partitions(base):
        config = os.path.join(base, topic, "config")
        text = open(config).read() if os.path.isfile(config) else ""
        if "log.cleanup.policy" in text:
            out.append((topic, partition, "log.cleanup.policy=cleanup" in text))
    return out


def serve_main(argv: list[str] | None = None) -> int:
    """`python tests/real_broker.py -p BASE --port N --tank T --tank-cli C [--produce]`: the real broker as a fleet
    host (bench/fleet.py --tank), in the stand-in's shape (tank_log/tools/standin_broker.py).

    It serves BASE, writes its own pid to --pidfile (the broker's to PIDFILE.tank), and stops the broker on SIGINT
    (unless BASE/.stubborn exists then, as a broker that will not stop tonight). With --produce, keyed messages
    (`standin_broker.fleet_message`) go through the broker's produce path (`tank-cli produce`), a bundle at a time
    to each partition of every topic whose config names a policy, at about --rate messages per second per
    partition; first every partition is consumed once, which gives its next seq and opens its RO segments (the
    broker's compaction at a roll aborts after a restart while some are unread, docs/FORMAT.md §11.14) and is
    checked: a message not as produced is printed. While PIDFILE.pause exists it produces nothing and says so with
    PIDFILE.paused (the fleet's checker then compares what the broker serves with `tank-log dump`). Exits 0 once
    the broker stopped cleanly, 3 when it was SIGKILLed (a crash: the fleet's fault), 1 when it died otherwise or
    printed a fatal message (its output, --log, says which)."""
    import argparse

    from tank_log.tools.standin_broker import fleet_message

    ap = argparse.ArgumentParser()
    ap.add_argument("-p", dest="base", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tank", required=True)
    ap.add_argument("--tank-cli", required=True)
    ap.add_argument("--pidfile")
    ap.add_argument("--log", help="the broker's output, appended")
    ap.add_argument("--produce", action="store_true")
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--bundle", type=int, default=10)
    args = ap.parse_args(argv)
    stop: list[int] = []

    def on_sigint(*_: object) -> None:
        if not os.path.exists(os.path.join(args.base, ".stubborn")):
            stop.append(1)

    signal.signal(signal.SIGINT, on_sigint)
    broker = RealBroker(args.tank, args.tank_cli, args.base, port=args.port, log_path=args.log)
    try:
        broker.start()
    except BrokerFailed as e:  # it exited on what it found, or never listened: its output says why
        print(f"the broker failed: {str(e)[:4000]}", file=sys.stderr, flush=True)
        return 1
    if args.pidfile:
        with open(args.pidfile + ".tank", "w") as fh:
            fh.write(str(broker.proc.pid if broker.proc else ""))
        with open(args.pidfile, "w") as fh:
            fh.write(str(os.getpid()))
    failed = None
    try:
        nxt: dict[tuple[str, int], int] = {}
        targets = _fleet_partitions(args.base) if args.produce else []
        for topic, partition, cleanup in targets:
            msgs = broker.consume(topic, partition)
            nxt[(topic, partition)] = msgs[-1].seq + 1 if msgs else 1
            wrong = [m.seq for m in msgs if (m.key, m.value) != fleet_message(topic, partition, m.seq, cleanup)]
            if wrong:
                print(f"{topic}/{partition} seqs {wrong[:10]}: served, not as produced", file=sys.stderr, flush=True)
        next_at = time.monotonic()
        pause = f"{args.pidfile}.pause" if args.pidfile else None
        while not stop:
            if broker.fatal() is not None:
                break
            if pause and os.path.exists(pause):  # the fleet's checker compares what the broker serves: hold still
                open(f"{pause}d", "w").close()
                time.sleep(0.02)
                continue
            if pause and os.path.exists(f"{pause}d"):
                os.unlink(f"{pause}d")
            if not targets or time.monotonic() < next_at:
                time.sleep(0.02)
                continue
            for topic, partition, cleanup in targets:
                first = nxt[(topic, partition)]
                pairs = []
                for seq in range(first, first + args.bundle):
                    pairs.append(fleet_message(topic, partition, seq, cleanup))
                if stop:
                    break
                broker.produce_bundle(topic, partition, pairs)
                nxt[(topic, partition)] = first + args.bundle
            next_at = max(next_at + args.bundle / args.rate, time.monotonic() - 1)  # no burst after a stall
    except BrokerFailed as e:
        failed = str(e)
    finally:
        failed = failed or broker.fatal()
        code = broker.stop()
    if code == -signal.SIGKILL and not any(mark in broker.log() for mark in FATAL_MARKS):  # a crash, no abort
        print(f"the broker was SIGKILLed (exit {code})", file=sys.stderr, flush=True)
        return 3
    if failed or code != 0:
        print(f"the broker failed: {failed or f'exit {code} at SIGINT'}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(serve_main())
