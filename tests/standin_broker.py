"""A stand-in TANK broker for the maintenance-window tests, run as `python standin_broker.py -p BASE --port N ...`
(the broker runs as `tank -p BASE`): it holds every file under BASE open (the broker keeps segments and indexes
open), accepts connections on a loopback port, and exits on SIGINT (TANK's clean shutdown) — unless --stubborn.
`--events FILE` gets a line `up NAME` once it serves and `down NAME` once it let go of the files."""

import argparse
import os
import signal
import socket
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-p", dest="base", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", default="broker")
    ap.add_argument("--pidfile")
    ap.add_argument("--events")
    ap.add_argument("--stubborn", action="store_true", help="ignore SIGINT (a broker that will not stop)")
    args = ap.parse_args()
    stop = []
    signal.signal(signal.SIGINT, signal.SIG_IGN if args.stubborn else lambda *_: stop.append(1))
    files = [open(os.path.join(d, f), "rb") for d, _, fs in os.walk(args.base) for f in fs]  # noqa: SIM115
    server = socket.create_server(("127.0.0.1", args.port))
    server.settimeout(0.1)
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
    server.close()
    for f in files:
        f.close()
    event("down")


if __name__ == "__main__":
    main()
