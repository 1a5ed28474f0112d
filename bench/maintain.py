"""One nightly maintenance run (jobs/maintain.py) against the three single-purpose jobs run one after the other
(retention, compaction, index verify/rebuild) on copies of the same data, local Spark, alternating, N rounds.

    .venv/bin/python bench/maintain.py [--rounds 3] [--copies 4]

Data: `--copies` demo base paths merged into one base path (6 partitions each, topics renamed), so the run has
some work per partition besides the Spark start-up. Prints the wall times and their ratio per round."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from common import machine, run_job


def make_data(directory: str, copies: int) -> str:
    from tank_log.tools.demo import write_demo

    base = os.path.join(directory, "base")
    os.makedirs(base)
    for i in range(copies):
        one = write_demo(os.path.join(directory, f"demo{i}"), seed=i, now_ms=1_790_000_000_000)
        for topic in os.listdir(one):
            if not topic.startswith("."):
                shutil.move(os.path.join(one, topic), os.path.join(base, f"{topic}{i}"))
    return base


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--copies", type=int, default=4)
    args = p.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        template = make_data(os.path.join(tmp, "template"), args.copies)
        for rnd in range(args.rounds):
            a = shutil.copytree(template, os.path.join(tmp, f"a{rnd}"))
            b = shutil.copytree(template, os.path.join(tmp, f"b{rnd}"))
            maintain = run_job("maintain", "--data-dir", a, "--broker-stopped")[0]
            separate = sum(
                run_job(job, "--data-dir", b, "--broker-stopped")[0]
                for job in ("retention", "compact", "rebuild_indexes")
            )
            ratio = maintain / separate
            print(f"round {rnd + 1}: maintain {maintain:.1f} s, three jobs {separate:.1f} s, ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
