"""A stand-in TANK broker for the Airflow demo (scripts/airflow-demo.sh), the maintenance-window tests and the fleet
soak (bench/fleet.py), run as `python -m tank_log.tools.standin_broker -p BASE --port N ...` (the real broker runs
as `tank -p BASE -l HOST:PORT`): it holds every file under BASE open (the broker keeps segments and indexes open),
accepts connections on a loopback port, and exits on SIGINT (TANK's clean shutdown) — unless --stubborn, or unless
a file `BASE/.stubborn` exists when SIGINT comes (a broker that will not stop tonight). `--events FILE` gets a line
`up NAME` once it serves and `down NAME` once it let go of the files.

With `--produce`, while up it appends keyed messages through the library's appender (`PartitionAppender`), a
bundle at a time to each partition of every topic under BASE whose `config` names a policy, at about `--rate`
messages per second per partition. What a message holds is a function of its topic, partition and seq
(`fleet_message`), so a checker knows every message ever produced from the partitions' last seqs alone.
`--messages N` stops producing after N messages per partition (then `--events` gets `produced NAME`).

With `--life`, the appends live as the broker's do: a MODEL of the broker, for machines without it (the real broker,
TANK_BIN, is the oracle: tests/e2e/test_broker_afterlife.py runs the same life on either). An append first rolls the
active segment when it holds more than `log.segment.bytes` (strictly) or is older than the broker's roll age
(docs/FORMAT.md §2.4 rules 4 and 6); the RO name takes the active log's mtime (§2.2, §2.5); each roll then applies
the broker's retention to the partition (§5). The model (tank_log/tools/standin_life.py) leaves out the broker's
compaction of `cleanup` topics at a roll (§6: they keep everything here) and its size undercount (§5 counts RO
segments not read since the partition's open as 0 bytes; here every RO segment counts its real size, as the broker
does once a client read them all).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time
import zlib

NKEYS = 300  # keys of a `cleanup` topic's messages (each is overwritten many times a night)


def fleet_message(topic: str, partition: int, seq: int, cleanup: bool) -> tuple[bytes, bytes]:
    """The key and value of message `seq` of a partition: in a `cleanup` topic, NKEYS keys with a tombstone (empty
    value) one time in 23; in a `delete` topic, every message its own key."""
    mix = zlib.crc32(b"%s/%d/%d" % (topic.encode(), partition, seq))
    if cleanup:
        key = b"k%03d" % (mix % NKEYS)
        return key, b"" if (mix >> 16) % 23 == 0 else b"%s/%d/%d/" % (topic.encode(), partition, seq) + b"c" * 40
    return b"e%d" % seq, b"%s/%d/%d/" % (topic.encode(), partition, seq) + b"x" * 60


def _topics(base: str) -> list[tuple[str, int, bool]]:
    """(topic, partition, cleanup) of every partition under BASE whose topic's config names a policy."""
    out = []
    for topic in sorted(os.listdir(base)):
        config = os.path.join(base, topic, "config")
        if topic.startswith(".") or not os.path.isfile(config):
            continue
        cleanup = "log.cleanup.policy=cleanup" in open(config).read()
        for p in sorted(os.listdir(os.path.join(base, topic))):
            if p.isdigit():
                out.append((topic, int(p), cleanup))
    return out


class Producer:
    """Appends a bundle to each partition in turn, at about `rate` messages per second per partition (`limit`: at
    most that many per partition; `life`: through LifeAppender)."""

    def __init__(self, base: str, rate: float, bundle: int, *, limit: int = 0, life: bool = False) -> None:
        from tank_log.storage.appender import PartitionAppender
        from tank_log.tools.standin_life import LifeAppender

        self.rate, self.bundle, self.limit = rate, bundle, limit
        self.partitions = [
            (
                topic,
                pid,
                cleanup,
                LifeAppender(os.path.join(base, topic, str(pid)), topic, pid)
                if life
                else PartitionAppender(os.path.join(base, topic, str(pid))),
            )
            for topic, pid, cleanup in _topics(base)
        ]
        self.produced = 0  # per partition
        self.next_at = time.monotonic()

    @property
    def done(self) -> bool:
        return bool(self.limit) and self.produced >= self.limit

    def step(self) -> None:
        from tank_log.format.bundle import Message

        if self.done or time.monotonic() < self.next_at:
            return
        now_ms = int(time.time() * 1000)
        n = self.bundle if not self.limit else min(self.bundle, self.limit - self.produced)
        for topic, pid, cleanup, appender in self.partitions:
            first = appender.next_seq
            msgs = [Message(seq, now_ms, *fleet_message(topic, pid, seq, cleanup)) for seq in range(first, first + n)]
            appender.append(msgs)
        self.produced += n
        self.next_at = max(self.next_at + self.bundle / self.rate, time.monotonic() - 1)  # no burst after a stall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-p", dest="base", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", default="broker")
    ap.add_argument("--pidfile")
    ap.add_argument("--events")
    ap.add_argument("--stubborn", action="store_true", help="ignore SIGINT (a broker that will not stop)")
    ap.add_argument("--produce", action="store_true", help="append keyed messages while up")
    ap.add_argument("--rate", type=float, default=200.0, help="with --produce: messages per second per partition")
    ap.add_argument("--bundle", type=int, default=20, help="with --produce: messages per bundle")
    ap.add_argument("--messages", type=int, default=0, help="with --produce: stop after this many per partition")
    ap.add_argument(
        "--life", action="store_true", help="with --produce: roll and apply retention as the broker does (a model)"
    )
    args = ap.parse_args()
    stop: list[int] = []

    def on_sigint(*_: object) -> None:
        if not os.path.exists(os.path.join(args.base, ".stubborn")):
            stop.append(1)

    signal.signal(signal.SIGINT, signal.SIG_IGN if args.stubborn else on_sigint)
    files = [open(os.path.join(d, f), "rb") for d, _, fs in os.walk(args.base) for f in fs]  # noqa: SIM115
    producer = (
        Producer(args.base, args.rate, args.bundle, limit=args.messages, life=args.life) if args.produce else None
    )
    server = socket.create_server(("127.0.0.1", args.port))
    server.settimeout(0.02 if producer else 0.1)
    if args.pidfile:
        with open(args.pidfile, "w") as fh:
            fh.write(str(os.getpid()))

    def event(what: str) -> None:
        if args.events:
            with open(args.events, "a") as fh:
                fh.write(f"{what} {args.name} {time.time():.3f}\n")

    event("up")
    print("ready", flush=True)
    while not stop:
        try:
            conn, _ = server.accept()
            conn.close()
        except TimeoutError:
            pass
        if producer is not None and not producer.done:
            producer.step()
            if producer.done:
                event("produced")
    server.close()
    for f in files:
        f.close()
    event("down")


if __name__ == "__main__":
    main()
