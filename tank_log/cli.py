"""`tank-log` command line: dump, verify, stats, demo (see --help of each)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from .errors import TankFormatError


def _cmd_dump(args: argparse.Namespace) -> int:
    from .dump import dump_path

    out = sys.stdout
    for line in dump_path(args.path, bundles=args.bundles, topics=args.topics):
        out.write(line)
        out.write("\n")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify_path

    problems = verify_path(args.path)
    shown = [p for p in problems if args.warnings or p.severity == "error"]
    if args.json:
        for p in shown:
            print(json.dumps(p.to_dict()))
    else:
        for p in shown:
            print(p)
        errors = sum(p.severity == "error" for p in problems)
        print(f"{errors} error(s), {len(problems) - errors} warning(s)", file=sys.stderr)
    return 1 if any(p.severity == "error" for p in problems) else 0


def _cmd_stats(args: argparse.Namespace) -> int:
    from .stats import format_table, stats_path

    rows = stats_path(args.path, args.topics)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        print(format_table(rows))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import write_demo

    path = write_demo(args.dir, seed=args.seed)
    print(f"demo data written to {path}", file=sys.stderr)
    return 0


def _topics(value: str) -> list[str]:
    return [t for t in value.split(",") if t]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tank-log", description="Inspect and maintain TANK broker data files.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("dump", help="messages as JSON lines (or bundle headers with --bundles)")
    p.add_argument("path", help="segment file, partition dir, topic dir or base path")
    p.add_argument("--bundles", action="store_true", help="print bundle headers instead of messages")
    p.add_argument("--topics", type=_topics, help="comma-separated topics (base path only)")
    p.set_defaults(func=_cmd_dump)

    p = sub.add_parser("verify", help="check segments, indexes, names and layout; exit 0 only if clean")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="one JSON object per problem")
    p.add_argument("--warnings", action="store_true", help="also print warnings")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("stats", help="per-partition statistics")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p.add_argument("--topics", type=_topics)
    p.set_defaults(func=_cmd_stats)

    p = sub.add_parser("demo", help="write a demo data directory")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=7)
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.func(args)
    except TankFormatError as err:
        print(f"tank-log: {err}", file=sys.stderr)
        return 1
    except (FileNotFoundError, FileExistsError, NotADirectoryError, ValueError) as err:
        print(f"tank-log: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
